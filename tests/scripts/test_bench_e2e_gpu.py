"""scripts/bench_e2e_gpu.py without a GPU: its arguments and row selection, the markdown table and the JSON it
merges into, the weight bytes a decode step reads, a worker that dies, and the whole pipeline on CPU for our
export of the tiny synthetic checkpoint (checkpoint, export, worker process, table), run twice to show
the second run reuses the export and merges its rows into the same results."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_hybrid_testing.e2e import weight_bytes

from file_modules import load_file

bench = load_file("scripts/bench_e2e_gpu.py", "bench_e2e_gpu")


def test_defaults_follow_the_device_and_lists_are_parsed(tmp_path):
    gpu = bench.parse_args(["--work", str(tmp_path)])
    assert (gpu.sizes, gpu.prefill, gpu.batches, gpu.engine_requests) == (["0.8B", "9B"], [512, 8192], [1, 16, 32], 16)
    assert gpu.json == tmp_path / "results.json"
    cpu = bench.parse_args(["--device", "cpu", "--prefill", "8, 16", "--only", "a/*,b", "--only", "c",
                            "--repeats", "2"])
    assert (cpu.sizes, cpu.prefill, cpu.only, cpu.repeats, cpu.num_blocks) == (["tiny"], [8, 16], ["a/*", "b", "c"], 2,
                                                                                256)


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "3B"], "--sizes: unknown 3B"),
    (["--batches", "1,64"], "each must be 1..32"),
    (["--repeats", "0"], "must be positive"),
    (["--builder-option", "prune_lm_head"], "expected KEY=VALUE, got prune_lm_head"),
])
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_rows_cover_every_export_graph_mode_and_measurement_and_select_by_pattern():
    args = bench.parse_args(["--sizes", "9B", "--prefill", "512,8192", "--batches", "1,32"])
    ids = [r.id for r in bench.all_rows(args)]
    assert ids[0] == "copy-rate"
    assert {"9B/ours/weights", "9B/ours/eager/prefill-8192", "9B/ours/graph/decode-b32", "9B/ours-ms/graph/prefill-512",
            "9B/builder-fp16/eager/decode-b1", "9B/builder-int4/graph/prefill-8192", "9B/ours-paged/eager/engine-16",
            "9B/ours-paged/graph/engine-16-mtp", "9B/builder-paged/eager/engine-16-mtp"} <= set(ids)
    assert not [i for i in ids if "paged" in i and ("prefill" in i or "decode" in i)]  # the Engine rows only
    assert [i for i in ids if i.startswith("9B/ours/graph-2buf/")] == ["9B/ours/graph-2buf/decode-b1",
                                                                      "9B/ours/graph-2buf/decode-b32"]
    assert not [i for i in ids if "paged/graph-2buf" in i]
    assert len(ids) == len(set(ids))
    chosen = [r.id for r in bench.select(bench.all_rows(args), ["9B/ours/*", "copy-rate"], ["*/graph*/*"])]
    assert chosen == ["copy-rate", "9B/ours/weights", "9B/ours/eager/prefill-512", "9B/ours/eager/prefill-8192",
                      "9B/ours/eager/decode-b1", "9B/ours/eager/decode-b32"]
    cpu = bench.parse_args(["--device", "cpu"])
    assert not [r for r in bench.all_rows(cpu) if r.graph == "graph"]  # no CUDA graphs on CPU
    assert "tiny/builder-fp32/eager/prefill-128" in [r.id for r in bench.all_rows(cpu)]


def test_table_shows_numbers_ratios_goals_bounds_and_errors():
    args = bench.parse_args([])
    rows = {
        "copy-rate": {"bytes_per_s": 3.0e12, "device_name": "NVIDIA H100 80GB HBM3"},
        "9B/ours/weights": {"total": 19e9, "per_token": 15e9},
        "9B/ours/eager/prefill-512": {"prefill_ms": 20.0},
        "9B/ours/eager/prefill-8192": {"prefill_ms": 100.0},
        "9B/ours/eager/decode-b1": {"decode_tok_s": 150.0},
        "9B/ours/graph/prefill-8192": {"error": "RuntimeError: Graph capture is not supported with "
                                                "past_present_share_buffer set to false.\nmore"},
        "9B/ours-ms/eager/prefill-8192": {"prefill_ms": 140.0},
        "9B/builder-fp16/eager/prefill-8192": {"prefill_ms": 250.0},
        "9B/ours-paged/eager/engine-16": {"engine_tok_s": 900.0, "tokens": 1024},
        "9B/ours-paged/eager/engine-16-mtp": {"engine_tok_s": 700.0, "tokens": 1024, "acceptance": 0.01},
        "9B/builder-paged/eager/engine-16": {"error": "RuntimeError: export failed | status 1"},
    }
    runs = [{"date": "2026-12-06 06:00 UTC", "commit": "abc1234", "command": "bench_e2e_gpu.py --sizes 9B"}]
    table = bench.markdown({"runs": runs, "rows": rows}, args)
    assert "- device: NVIDIA H100 80GB HBM3" in table
    assert "- date: 2026-12-06 06:00 UTC; git commit: abc1234" in table
    assert "- command: `bench_e2e_gpu.py --sizes 9B`" in table
    assert "- device copy rate: 3.000 TB/s" in table
    lines = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): [c.strip() for c in line.strip("|").split("|")]
             for line in table.splitlines() if line.startswith("| 9B")}
    header_line = next(line for line in table.splitlines() if line.startswith("| size"))
    header = [c.strip() for c in header_line.strip("|").split("|")]
    ours = dict(zip(header, lines[("9B", "ours", "eager")]))
    assert ours["prefill 8192 ms"] == "100.0" and ours["ours × (prefill 8192)"] == "1.00x"
    assert ours["bound b1 tok/s"] == "200" and ours["weights/token GB"] == "15.000"  # 3e12 B/s / 15e9 B
    assert dict(zip(header, lines[("9B", "ours-ms", "eager")]))["ours × (prefill 8192)"] == "1.40x (goal 1.5x)"
    assert dict(zip(header, lines[("9B", "builder-fp16", "eager")]))["ours × (prefill 8192)"] == "2.50x ✓"
    graph = dict(zip(header, lines[("9B", "ours", "graph")]))
    assert graph["prefill 8192 ms"].startswith("✗ RuntimeError: Graph capture is not supported")
    assert "more" not in graph["prefill 8192 ms"]
    paged = dict(zip(header, lines[("9B", "ours-paged", "eager")]))
    assert (paged["engine-16 tok/s"], paged["engine-16-mtp tok/s"]) == ("900.0", "700.0 (acc 0.01)")
    builder_paged = dict(zip(header, lines[("9B", "builder-paged", "eager")]))
    assert builder_paged["engine-16 tok/s"] == "✗ RuntimeError: export failed / status 1"  # no stray column


def test_weight_bytes_skip_tables_read_by_row(tmp_path):
    embed = numpy_helper.from_array(np.zeros([10, 4], np.float16), "embed")  # Gather only: one row per token
    tied = numpy_helper.from_array(np.zeros([10, 4], np.float32), "tied")  # Gather and MatMul: read whole
    cos = numpy_helper.from_array(np.zeros([64, 2], np.float32), "cos")  # rotary cache
    packed = helper.make_tensor("packed", TensorProto.UINT4, [6, 4], np.zeros(24, np.uint8).tolist())
    nodes = [helper.make_node("Gather", ["embed", "ids"], ["e"]),
             helper.make_node("Gather", ["tied", "ids"], ["t"]),
             helper.make_node("MatMul", ["x", "tied"], ["y"], name="lm_head"),
             helper.make_node("RotaryEmbedding", ["q", "pos", "cos", "cos"], ["r"], domain="com.microsoft"),
             helper.make_node("Identity", ["packed"], ["p"])]
    graph = helper.make_graph(nodes, "g", [], [], initializer=[embed, tied, cos, packed])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert weight_bytes(path) == {"total": 80 + 160 + 512 + 12, "per_token": 160 + 12}


def test_cuda_exports_of_ours_name_the_cuda_provider_in_the_decoder_and_the_head(tmp_path):
    args = bench.parse_args(["--work", str(tmp_path), "--sizes", "tiny", "--cuda-arch", "90"])
    paged = next(e for e in bench.exports(args) if e.name == "ours-paged")
    package = bench.ensure_export(paged, "tiny", args)
    model = json.loads((package / "genai_config.json").read_text())["model"]
    for session in ("decoder", "mtp"):
        assert [entry for entry in model[session]["session_options"]["provider_options"] if "cuda" in entry], session
    command = json.loads((package / "bench_export.json").read_text())["command"]
    assert "-e cuda" in " ".join(command) and "--cuda-arch 90" in " ".join(command)
    assert sorted(p.name for p in (package / "onnx_hybrid_cuda").iterdir()) == ["sm90.cubin"]
    assert not (package.parent / (package.name + ".partial")).exists()


def test_a_worker_that_dies_leaves_its_reason_on_every_row_it_owed(tmp_path):
    args = bench.parse_args(["--device", "cpu", "--work", str(tmp_path), "--timeout", "60"])
    spec = {"kind": "measure", "device": "cpu", "graph": False, "package": str(tmp_path / "missing"),
            "plain_package": None, "threads": 1}  # no "rows": the worker dies reading its spec
    owed = ["tiny/ours/eager/prefill-8", "tiny/ours/eager/decode-b1"]
    results = bench.run_worker(spec, owed, args)
    for row_id in owed:
        error = results[row_id]["error"]
        assert error.startswith("worker exited with status 1: ") and "KeyError" in error, error


def test_a_model_that_fails_to_load_fails_its_rows_not_the_worker(tmp_path):
    args = bench.parse_args(["--device", "cpu", "--work", str(tmp_path), "--timeout", "60"])
    rows = [{"id": f"tiny/ours/eager/prefill-{n}", "measure": f"prefill-{n}", "params": {"length": n}} for n in (8, 24)]
    spec = {"kind": "measure", "device": "cpu", "graph": False, "package": str(tmp_path / "missing"),
            "plain_package": None, "threads": 1, "rows": rows}
    results = bench.run_worker(spec, [r["id"] for r in rows], args)
    for row in rows:
        error = results[row["id"]]["error"]
        assert not error.startswith("worker exited") and "missing" in error, error


def test_cpu_pipeline_for_our_export_reuses_the_export_and_merges_results(tmp_path, capsys):
    work = tmp_path / "work"
    base = ["--device", "cpu", "--work", str(work), "--prefill", "8,24", "--batches", "1,2", "--decode-prompt", "4",
            "--new-tokens", "3", "--repeats", "1", "--threads", "1"]
    assert bench.main([*base, "--only", "tiny/ours/*,copy-rate", "--skip", "*/decode-b2"]) == 0
    first = capsys.readouterr().out
    assert "exporting tiny_ours:" in first
    stamp = (work / "exports" / "tiny_ours" / "bench_export.json").stat().st_mtime_ns
    assert bench.main([*base, "--only", "tiny/ours/eager/decode-b2"]) == 0
    second = capsys.readouterr().out
    assert "exporting" not in second
    assert (work / "exports" / "tiny_ours" / "bench_export.json").stat().st_mtime_ns == stamp
    results = json.loads((work / "results.json").read_text())
    assert len(results["runs"]) == 2
    rows = results["rows"]
    assert set(rows) == {"copy-rate", "tiny/ours/weights", "tiny/ours/eager/prefill-8", "tiny/ours/eager/prefill-24",
                         "tiny/ours/eager/decode-b1", "tiny/ours/eager/decode-b2"}
    assert not [k for k, v in rows.items() if "error" in v], rows
    assert (rows["tiny/ours/eager/prefill-8"]["run"], rows["tiny/ours/eager/decode-b2"]["run"]) == (0, 1)
    assert results["runs"][1]["rows"] == ["tiny/ours/eager/decode-b2"]
    assert rows["tiny/ours/eager/prefill-24"]["prefill_ms"] > 0
    decode = rows["tiny/ours/eager/decode-b2"]
    assert decode["decode_tok_s"] > 0 and decode["decode_steady_tok_s"] > 0 and decode["first_step_ms"] > 0
    assert 0 < rows["tiny/ours/weights"]["per_token"] <= rows["tiny/ours/weights"]["total"]
    table = (work / "results.md").read_text()
    assert table in second and "| tiny | ours | eager |" in table
