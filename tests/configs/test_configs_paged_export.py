"""The paged export (`export-hybrid --paged`): graph I/O and config as onnxruntime-genai 0.18's Engine
expects them, validity, and numerics on CPU.

Full attention is PagedAttention, from our library (``onnx_hybrid``, the default; runs on CPU) or from
ONNX Runtime (``com.microsoft``, CUDA only), so on CPU:

* the graph's numerics (both kernels' graphs) are checked with ONNX's reference evaluator, running our
  float64 references, against transformers on two packed requests of different lengths (prefill, then one
  decode step on the updated pool);
* an ORT CPU session with our library runs the default export and agrees with the reference evaluator;
  the com.microsoft export fails exactly at the missing PagedAttention kernel.

onnxruntime-genai's Engine over the export is tested in test_engine_speculative_cpu.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnxruntime")

from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx.reference.op_run import OpRun  # noqa: E402

from onnx_hybrid.cli import export_main  # noqa: E402
from onnx_hybrid.configs import validate  # noqa: E402
from onnx_hybrid.exporter import ExportError, export  # noqa: E402
from onnx_hybrid.exporter.kv_pool import GPU_KV_CACHE_FRACTION  # noqa: E402
from onnx_hybrid.exporter.kv_pool import DEFAULT_POOL_BYTES, DEFAULT_POOL_REQUESTS, pool_num_blocks  # noqa: E402
from onnx_hybrid.exporter.model_config import load_model_config  # noqa: E402
from onnx_hybrid.ops import contract, reference  # noqa: E402
from onnx_hybrid_testing import packed as testing_packed  # noqa: E402
from onnx_hybrid_testing.checkpoints import GDN_HEADS, LAYOUTS, TEXT, load_reference, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.greedy import make_session  # noqa: E402

BLOCK_SIZE, NUM_BLOCKS, CAPACITY = 16, 4, 3
PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8, 21, 40, 77, 90, 13, 101], [44, 3, 150, 12, 9]]
NEXT = [61, 19]  # one decode token per request
BLOCK_TABLE = np.array([[3, 1], [0, 2]], dtype=np.int32)  # a non-identity block mapping; request 0 spans two
# HF is fp32; the com.microsoft graph keeps an fp32 model's pool in fp16: 1e-2 absolute on logits of
# magnitude ~5 covers that pool's rounding (measured max ~2e-3) with margin, and is far below a convention
# error (O(1)). With our kernel's fp32 pool only transformers' own fp32 rounding remains (measured 1.1e-4
# against the float64 evaluator).
LOGITS_TOL = {contract.DOMAIN: 1e-3, contract.MS_DOMAIN: 1e-2}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {layout: make_tiny_checkpoint(root / layout, layout, seed=5) for layout in LAYOUTS}


@pytest.fixture(scope="module")
def paged_exports(checkpoints, tmp_path_factory):
    """The paged export with each PagedAttention kernel."""
    root = tmp_path_factory.mktemp("paged")
    return {kernel: export(checkpoints["qwen3_5_text"], root / kernel, state_update_capacity=CAPACITY, paged=True,
                           block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, paged_attention=kernel, progress=False)
            for kernel in (contract.DOMAIN, contract.MS_DOMAIN)}


def read_config(out):
    return json.loads((out / "genai_config.json").read_text())


# --- config and validity ------------------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("capacity", [0, CAPACITY])
def test_paged_exports_validate_check_and_parse_in_og(layout, capacity, checkpoints, tmp_path):
    out = export(checkpoints[layout], tmp_path / "out", state_update_capacity=capacity, paged=True,
                 block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, progress=False)
    report = validate(out)
    assert report.ok and not report.warnings, report.format()
    onnx.checker.check_model(str(out / "model.onnx"))
    og.Config(str(out))
    decoder = read_config(out)["model"]["decoder"]
    kinds = [g["kind"] for g in decoder["state_groups"]]
    assert kinds == ["paged_kv", "fixed_conv", "fixed_recurrent"]
    assert all(("state_update" in g) == bool(capacity) for g in decoder["state_groups"][1:])
    assert "attention_mask" not in decoder["inputs"]
    assert read_config(out)["engine"] == {"dynamic_batching": {"block_size": BLOCK_SIZE, "num_blocks": NUM_BLOCKS}}


@pytest.mark.parametrize("dtype, pool", [("fp16", "FLOAT16"), ("bf16", "BFLOAT16")])
def test_half_precision_paged_exports_keep_the_pool_in_their_type(dtype, pool, checkpoints, tmp_path):
    out = export(checkpoints["qwen3_5_moe_text"], tmp_path / "out", dtype=dtype, state_update_capacity=2, paged=True,
                 block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, op_domain=contract.MS_DOMAIN, progress=False)
    assert validate(out).ok
    onnx.checker.check_model(str(out / "model.onnx"))
    og.Config(str(out))
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    types = {v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type) for v in graph.input}
    assert types["past_key_values.2.key"] == types["past.0.conv"] == pool
    assert types["past.0.recurrent"] == "FLOAT"
    [attention] = [n for n in graph.node if n.op_type == "PagedAttention"]
    producers = {o: n.op_type for n in graph.node for o in n.output}
    assert producers[attention.input[0]] == "Reshape"  # no Cast: q/k/v are already in the pool's type


@pytest.mark.parametrize("kernel, pool", [(contract.DOMAIN, "FLOAT"), (contract.MS_DOMAIN, "FLOAT16")])
def test_paged_io_is_what_the_engine_feeds(kernel, pool, paged_exports):
    graph = onnx.load(str(paged_exports[kernel] / "model.onnx"), load_external_data=False).graph

    def io(values):
        return {v.name: (onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type),
                         [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values}

    inputs, outputs = io(graph.input), io(graph.output)
    assert inputs["input_ids"] == ("INT64", ["num_tokens"])
    assert inputs["cumulative_sequence_lengths"] == ("INT32", ["batch_size_plus_1"])
    assert inputs["past_sequence_lengths"] == ("INT32", ["batch_size"])
    assert inputs["block_table"] == ("INT32", ["batch_size", "max_num_blocks"])
    assert inputs["attention_metadata"] == ("INT32", [3])
    assert inputs["past_key_values.2.key"] == (pool, ["num_blocks", BLOCK_SIZE, TEXT["num_key_value_heads"],
                                                      TEXT["head_dim"]])
    assert outputs["present.2.value"] == inputs["past_key_values.2.value"]
    assert outputs["logits"] == ("FLOAT", ["num_tokens", TEXT["vocab_size"]])
    assert outputs["state_update.0.recurrent_capsule"] == ("FLOAT", ["batch_size", contract.gdn_capsule_width(
        CAPACITY, *GDN_HEADS)])
    attention = [n for n in graph.node if n.op_type == "PagedAttention"]
    assert [n.domain for n in attention] == [kernel]
    assert attention[0].output[1:] == ["present.2.key", "present.2.value"]  # the pool, updated in place


def test_paged_bindings_form_and_cli_options(checkpoints, tmp_path):
    out = tmp_path / "out"
    assert export_main([str(checkpoints["qwen3_5_text"]), "-o", str(out), "--paged", "--block-size", "32",
                        "--num-blocks", "8", "--state-update-capacity", "2", "--manifest-format", "bindings",
                        "--op-domain", "com.microsoft", "-q"]) == 0
    report = validate(out)
    assert report.ok and report.form == "bindings", report.format()
    groups = read_config(out)["model"]["decoder"]["state_groups"]
    assert groups[0] == {"kind": "paged_kv", "layer_ids": [2], "bindings": {
        "key": {"input": "past_key_values.%d.key", "output": "present.%d.key"},
        "value": {"input": "past_key_values.%d.value", "output": "present.%d.value"}}}
    assert read_config(out)["engine"]["dynamic_batching"]["block_size"] == 32


def test_paged_io_matches_the_0_18_builders_paged_export(checkpoints, tmp_path):
    """onnxruntime-genai's own builder, fp16 CUDA paged export with capacity 3 (it builds the graph on any
    machine): our validator accepts it, and our paged export of the same checkpoint declares the same
    tensors with the same types and ranks (except position_ids: the builder's MRoPE [3, num_tokens], our
    text positions [num_tokens]; the Engine takes both) and the same state_groups."""
    import subprocess
    import sys

    builder = tmp_path / "builder"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoints["qwen3_5_multimodal"]),
                    "-o", str(builder), "-p", "fp16", "-e", "cuda", "-c", str(tmp_path / "cache"), "--extra_options",
                    "use_paged_attention=true", f"state_update_capacity={CAPACITY}", f"num_blocks={NUM_BLOCKS}",
                    f"paged_block_size={BLOCK_SIZE}"], check=True, capture_output=True)
    assert validate(builder).ok, validate(builder).format()
    ours = export(checkpoints["qwen3_5_multimodal"], tmp_path / "ours", dtype="fp16", state_update_capacity=CAPACITY,
                  paged=True, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, op_domain=contract.MS_DOMAIN, progress=False)

    def signature(out):
        graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
        return {v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
                for v in list(graph.input) + list(graph.output) if v.name != "position_ids"}

    assert signature(ours) == signature(builder)
    theirs, mine = read_config(builder)["model"]["decoder"], read_config(ours)["model"]["decoder"]
    assert mine["state_groups"] == theirs["state_groups"]
    assert mine["inputs"] == theirs["inputs"]
    assert mine["outputs"] == theirs["outputs"]


@pytest.mark.parametrize("options, message", [
    (dict(block_size=24), "power of two"), (dict(block_size=8), "power of two"), (dict(num_blocks=0), "positive"),
    (dict(paged_attention="ai.onnx"), "paged_attention must be one of onnx_hybrid, com.microsoft")])
def test_bad_paged_options(options, message, checkpoints, tmp_path):
    with pytest.raises(ExportError, match=message):
        export(checkpoints["qwen3_5_text"], tmp_path / "out", paged=True, progress=False, **options)


def test_our_paged_attention_with_orts_state_ops(checkpoints, tmp_path):
    """--op-domain com.microsoft --paged-attention onnx_hybrid: ORT's GDN/conv kernels, our attention; the
    library is copied and named because the graph still has one of our ops."""
    out = tmp_path / "out"
    assert export_main([str(checkpoints["qwen3_5_text"]), "-o", str(out), "--paged", "--block-size", "16",
                        "--num-blocks", "4", "--op-domain", "com.microsoft", "--paged-attention", "onnx_hybrid",
                        "-q"]) == 0
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    domains = {n.op_type: n.domain for n in graph.node if n.domain not in ("", "ai.onnx")}
    assert domains["PagedAttention"] == contract.DOMAIN and domains["GatedDeltaNet"] == contract.MS_DOMAIN
    library = read_config(out)["model"]["decoder"]["session_options"]["custom_ops_library"]
    assert (out / library).is_file()
    assert validate(out).ok


# --- running the graph --------------------------------------------------------------------------


def packed_feeds(graph: onnx.GraphProto, steps: list[list[int]], past: list[int], state: dict | None) -> dict:
    return testing_packed.packed_feeds(graph, steps, past, state, block_table=BLOCK_TABLE, num_blocks=NUM_BLOCKS)


def _contract_op(spec: contract.OpSpec, run, domain: str = contract.DOMAIN):
    """An evaluator op running a float64 reference, returning the types the kernel returns. A com.microsoft
    PagedAttention node has our op's inputs first, then inputs the export leaves empty or unused."""
    def _run(self, *inputs, **attributes):
        feeds = {port.name: x for port, x in zip(spec.inputs, inputs) if x is not None}
        results = run(feeds, **attributes)
        return tuple(r.astype(inputs[0].dtype if port.type == "T" else np.float32)
                     for port, r in zip(spec.outputs, results))

    return type(spec.name, (OpRun,), {"op_domain": domain, "_run": _run})


class SkipSimplifiedLayerNormalization(OpRun):
    """com.microsoft's fused residual add + RMSNorm, in float64: (norm, mean, inv_std, sum)."""
    op_domain = contract.MS_DOMAIN

    def _run(self, x, skip, gamma, epsilon=None):
        total = x.astype(np.float64) + skip
        inv_std = 1.0 / np.sqrt(np.mean(total * total, axis=-1, keepdims=True) + epsilon)
        return ((total * inv_std * gamma).astype(x.dtype), np.zeros_like(inv_std, np.float32),
                inv_std.astype(np.float32), total.astype(x.dtype))


class RotaryEmbedding(OpRun):
    """com.microsoft's RoPE, rotate-half on the first rotary_embedding_dim dims of each head, in float64."""
    op_domain = contract.MS_DOMAIN

    def _run(self, x, positions, cos_cache, sin_cache, interleaved=None, num_heads=None, rotary_embedding_dim=None,
             **_):
        assert not interleaved
        b, s, width = x.shape
        heads = x.astype(np.float64).reshape(b, s, num_heads, width // num_heads)
        half = rotary_embedding_dim // 2
        cos = cos_cache.astype(np.float64)[positions][:, :, None, :]
        sin = sin_cache.astype(np.float64)[positions][:, :, None, :]
        x1, x2 = heads[..., :half], heads[..., half:rotary_embedding_dim]
        out = heads.copy()
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rotary_embedding_dim] = x2 * cos + x1 * sin
        return (out.reshape(b, s, width).astype(x.dtype),)


REFERENCE_OPS = [SkipSimplifiedLayerNormalization, RotaryEmbedding,
                 _contract_op(contract.GATED_DELTA_NET, reference.gated_delta_net),
                 _contract_op(contract.VARLEN_CAUSAL_CONV, reference.varlen_causal_conv),
                 _contract_op(contract.PAGED_ATTENTION, reference.paged_attention),
                 _contract_op(contract.PAGED_ATTENTION, reference.paged_attention, contract.MS_DOMAIN)]


def run_reference(model: onnx.ModelProto, feeds: dict) -> dict:
    evaluator = ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, evaluator.run(None, feeds)))


@pytest.mark.parametrize("kernel", [contract.DOMAIN, contract.MS_DOMAIN])
def test_paged_graph_matches_transformers(kernel, paged_exports, checkpoints):
    model = onnx.load(str(paged_exports[kernel] / "model.onnx"))
    prefill = run_reference(model, packed_feeds(model.graph, PROMPTS, [0, 0], None))
    decode = run_reference(model, packed_feeds(model.graph, [[t] for t in NEXT], [len(p) for p in PROMPTS], prefill))

    hf = load_reference(checkpoints["qwen3_5_text"])
    offsets = np.cumsum([0] + [len(p) for p in PROMPTS])
    worst = 0.0
    for b, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = hf(torch.tensor([prompt + [NEXT[b]]])).logits[0].numpy()
        got = np.concatenate([prefill["logits"][offsets[b]:offsets[b + 1]], decode["logits"][b:b + 1]])
        worst = max(worst, float(np.abs(got - expected).max()))
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    assert worst < LOGITS_TOL[kernel], worst


def test_cpu_session_runs_the_default_paged_export(paged_exports):
    """Our library carries every custom kernel of the default export: an ORT CPU session runs a prefill and
    a decode step on the updated pool, in agreement with the float64 reference evaluator."""
    session = make_session(paged_exports[contract.DOMAIN], contract.DOMAIN)
    model = onnx.load(str(paged_exports[contract.DOMAIN] / "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    state = None
    for steps, past in ((PROMPTS, [0, 0]), ([[t] for t in NEXT], [len(p) for p in PROMPTS])):
        feeds = packed_feeds(model.graph, steps, past, state)
        results = dict(zip(names, session.run(None, feeds)))
        expected = run_reference(model, feeds)
        for name in names:
            # Both sides are fp32 with different GEMM summation orders (MLAS against numpy's BLAS): an output's
            # rounding error scales with the magnitudes summed into it, so the bound follows the tensor's largest
            # value (logits reach ~7 here: 7e-4, far below what a wrong kernel gives).
            atol = 1e-4 * max(1.0, float(np.abs(expected[name]).max()))
            np.testing.assert_allclose(results[name], expected[name], atol=atol, rtol=1e-4, err_msg=name)
        state = results


def test_com_microsoft_paged_attention_has_no_cpu_kernel(paged_exports):
    with pytest.raises(Exception, match=r"Could not find an implementation for PagedAttention\(1\) node with name "
                                        r"'/model/layers.2/attn/PagedAttention'"):
        make_session(paged_exports[contract.MS_DOMAIN], contract.DOMAIN)  # our library registered, as a run would


def test_default_pool_holds_full_context_requests_within_the_budget(checkpoints):
    """Our kernel's default pool: DEFAULT_POOL_REQUESTS full-context requests, plus an MTP head's proportional
    share (og.Engine splits the blocks by KV bytes), at most DEFAULT_POOL_BYTES; --num-blocks overrides it."""
    cfg = load_model_config(checkpoints["qwen3_5_text"])  # one full-attention layer, context 512

    def blocks(config=cfg, **kw):
        return pool_num_blocks(None, config, block_size=16, kernel=contract.DOMAIN, itemsize=4, **kw)

    assert blocks() == DEFAULT_POOL_REQUESTS * 512 // 16
    assert blocks(head_layers=1) == 2 * blocks()
    assert pool_num_blocks(7, cfg, block_size=16, kernel=contract.DOMAIN, itemsize=4) == 7
    long = dataclasses.replace(cfg, max_position_embeddings=262144, num_kv_heads=4, head_dim=256)
    block_bytes = 2 * 16 * 4 * 256 * 4  # keys and values of the one full-attention layer
    assert blocks(long) == DEFAULT_POOL_BYTES // block_bytes < DEFAULT_POOL_REQUESTS * 262144 // 16


def test_cuda_paged_attention_leaves_the_pool_to_the_runtime(checkpoints, tmp_path):
    """com.microsoft::PagedAttention runs on CUDA only, where og.Engine sizes the pool from the GPU's memory: no
    num_blocks is written, but the share of free memory it may take (0.18 has no default), and the validator does
    not warn about it."""
    out = export(checkpoints["qwen3_5_text"], tmp_path / "out", paged=True, block_size=BLOCK_SIZE,
                 op_domain=contract.MS_DOMAIN, progress=False)
    assert read_config(out)["engine"] == {"dynamic_batching": {"block_size": BLOCK_SIZE,
                                                               "gpu_utilization_factor": GPU_KV_CACHE_FRACTION}}
    report = validate(out)
    assert report.ok and not report.warnings, report.format()
