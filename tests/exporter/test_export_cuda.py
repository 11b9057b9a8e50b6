"""``export-hybrid -e cuda`` on a host without a GPU: what the export says and carries for onnxruntime-genai-cuda.

The provider in genai_config.json (decoder and MTP head) in the form onnxruntime-genai 0.18 parses, fp16 by
default, the library's kernel images for the requested architectures in onnx_hybrid_cuda/ beside its copy of the
library, ORT's CUDA PagedAttention in the paged graph, and the validator's provider rules, each checked against
onnxruntime-genai's CPU build where it has an opinion. The GPU run itself is tests/genai/test_genai_cuda.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from onnx_hybrid import cli
from onnx_hybrid.configs.validator import validate
from onnx_hybrid.exporter import ExportError, export
from onnx_hybrid.exporter.kv_pool import GPU_KV_CACHE_FRACTION
from onnx_hybrid.ops import contract, library
from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint
from onnx_hybrid_testing.greedy import GreedyDriver, make_session

og = pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("hf") / "hf", "qwen3_5_multimodal", seed=1, mtp=True)


@pytest.fixture(autouse=True)
def fake_images(monkeypatch):
    """Stand-in images: compiling real ones takes about a minute per architecture (tests/cuda/test_cuda_ops_build.py
    builds them); here only their placement matters."""
    monkeypatch.setattr(library, "cuda_image", lambda arch: b"\x7fELF stand-in sm%d" % arch)


def config_of(out):
    return json.loads((out / "genai_config.json").read_text())


def test_cuda_export_names_the_provider_and_carries_images(checkpoint, tmp_path):
    out = export(checkpoint, tmp_path / "out", execution_provider="cuda", cuda_archs=[90, 80], progress=False)
    config = config_of(out)
    for section in ("decoder", "mtp"):
        options = config["model"][section]["session_options"]
        # No CUDA graphs with an MTP head: og's speculative verify steps change shape from step to step.
        assert options["provider_options"] == [{"cuda": {"enable_cuda_graph": "0"}}]
        assert options["custom_ops_library"] == "libonnx_hybrid_ortops.so"
    images = sorted(p.name for p in (out / library.IMAGE_FOLDER).iterdir())
    assert images == ["sm80.cubin", "sm90.cubin"]
    assert (out / library.IMAGE_FOLDER / "sm90.cubin").read_bytes() == b"\x7fELF stand-in sm90"
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert graph.input[0].name == "input_ids"
    logits = next(o for o in graph.output if o.name == "logits")
    assert logits.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16  # fp16 by default on cuda
    report = validate(out)
    assert report.ok and not report.warnings, report.format()


def test_default_architectures_and_cpu_stays_the_default(checkpoint, tmp_path):
    out = export(checkpoint, tmp_path / "cuda", execution_provider="cuda", mtp=False, progress=False)
    assert sorted(p.name for p in (out / library.IMAGE_FOLDER).iterdir()) == [
        f"sm{a}.cubin" for a in library.DEFAULT_CUDA_ARCHS]
    cpu = export(checkpoint, tmp_path / "cpu", mtp=False, progress=False)
    assert config_of(cpu)["model"]["decoder"]["session_options"]["provider_options"] == []
    assert not (cpu / library.IMAGE_FOLDER).exists()
    graph = onnx.load(str(cpu / "model.onnx"), load_external_data=False).graph
    assert next(o for o in graph.output if o.name == "logits").type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_paged_cuda_export_uses_orts_cuda_paged_attention(checkpoint, tmp_path):
    out = export(checkpoint, tmp_path / "out", execution_provider="cuda", cuda_archs=[90], paged=True,
                 state_update_capacity=3, block_size=16, progress=False)
    nodes = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
    paged = [n for n in nodes if n.op_type == "PagedAttention"]
    assert paged and {n.domain for n in paged} == {contract.MS_DOMAIN}
    assert {n.domain for n in nodes if n.op_type == contract.GATED_DELTA_NET.name} == {contract.DOMAIN}
    pool = config_of(out)["engine"]["dynamic_batching"]  # the runtime sizes the pool on a GPU
    assert "num_blocks" not in pool and pool["gpu_utilization_factor"] == GPU_KV_CACHE_FRACTION
    report = validate(out)
    assert report.ok, report.format()


def test_com_microsoft_cuda_export_needs_no_library(checkpoint, tmp_path):
    out = export(checkpoint, tmp_path / "out", execution_provider="cuda", op_domain=contract.MS_DOMAIN, mtp=False,
                 progress=False)
    options = config_of(out)["model"]["decoder"]["session_options"]
    assert options["provider_options"] == [{"cuda": {"enable_cuda_graph": "1"}}]
    assert "custom_ops_library" not in options
    assert not (out / library.IMAGE_FOLDER).exists()


def test_cli_flags(checkpoint, tmp_path, capsys):
    assert cli.export_main([str(checkpoint), "-o", str(tmp_path / "a"), "-e", "cuda", "--cuda-arch", "89",
                            "--dtype", "fp32", "--no-mtp", "-q"]) == 0
    assert [p.name for p in (tmp_path / "a" / library.IMAGE_FOLDER).iterdir()] == ["sm89.cubin"]
    assert cli.export_main([str(checkpoint), "-o", str(tmp_path / "b"), "--cuda-arch", "90", "-q"]) == cli.USAGE_ERROR
    assert "--cuda-arch" in capsys.readouterr().err and not (tmp_path / "b").exists()
    with pytest.raises(SystemExit):
        cli.export_main([str(checkpoint), "-o", str(tmp_path / "c"), "-e", "rocm"])
    with pytest.raises(ExportError, match="compute capabilities"):
        export(checkpoint, tmp_path / "d", execution_provider="cuda", cuda_archs=[9])


@pytest.mark.parametrize("entry, rule, genai_error", [
    ({"cuda": {"enable_cuda_graph": 1}}, "parse.provider_options", "Expected a string but saw a number"),
    ({"bogus": {}}, "x.provider_name", "Unknown provider name 'bogus'"),
], ids=["number-option", "unknown-provider"])
def test_validator_provider_rules_agree_with_onnxruntime_genai(checkpoint, tmp_path, entry, rule, genai_error):
    out = export(checkpoint, tmp_path / "out", mtp=False, progress=False)
    model = og.Model(str(out))  # the unmutated export loads
    del model
    config = config_of(out)
    config["model"]["decoder"]["session_options"]["provider_options"] = [entry]
    (out / "genai_config.json").write_text(json.dumps(config))
    report = validate(out)
    assert [f.rule for f in report.findings if f.severity == "error"] == [rule], report.format()
    with pytest.raises(Exception, match=genai_error):
        og.Model(str(out))


def test_cuda_exports_share_kv_buffers_and_capture_by_default(checkpoint, tmp_path):
    """-e cuda in fp16 without an MTP head: GroupQueryAttention over shared buffers and enable_cuda_graph on; fp32
    (ORT's CUDA GroupQueryAttention has no fp32 kernel) and paged exports keep their KV layout, without graphs.
    CPU exports share their buffers too, without graphs."""
    def exported(name, **options):
        out = export(checkpoint, tmp_path / name, execution_provider="cuda", cuda_archs=[90], progress=False,
                     **options)
        config = config_of(out)
        nodes = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
        return (config["model"]["decoder"]["session_options"]["provider_options"],
                config["search"]["past_present_share_buffer"], any(n.op_type == "GroupQueryAttention" for n in nodes))

    assert exported("fp16", mtp=False) == ([{"cuda": {"enable_cuda_graph": "1"}}], True, True)
    assert exported("no_graph", mtp=False, cuda_graph=False) == ([{"cuda": {"enable_cuda_graph": "0"}}], True, True)
    assert exported("fp32", mtp=False, dtype="fp32") == ([{"cuda": {"enable_cuda_graph": "0"}}], False, False)
    assert exported("paged", mtp=False, paged=True, block_size=16)[:2] == ([{"cuda": {"enable_cuda_graph": "0"}}],
                                                                           False)
    with pytest.raises(ExportError, match="cuda_graph .* shared"):
        export(checkpoint, tmp_path / "refused", execution_provider="cuda", kv_cache="concat", cuda_graph=True)
    cpu = config_of(export(checkpoint, tmp_path / "cpu", mtp=False, progress=False))
    assert cpu["search"]["past_present_share_buffer"] is True  # shared on the CPU too (GQA has fp32 kernels there)
    assert config_of(export(checkpoint, tmp_path / "cpu_concat", mtp=False, kv_cache="concat", progress=False)
                     )["search"]["past_present_share_buffer"] is False


def test_validator_refuses_cuda_graphs_without_shared_buffers(checkpoint, tmp_path):
    """onnxruntime-genai-cuda 0.18 fails og.Model with "Graph capture is not supported with
    past_present_share_buffer set to false" (seen on an H100; the CPU build has no CUDA provider to load)."""
    out = export(checkpoint, tmp_path / "out", execution_provider="cuda", cuda_archs=[90], mtp=False, progress=False)
    assert validate(out).ok
    config = config_of(out)
    config["search"]["past_present_share_buffer"] = False
    (out / "genai_config.json").write_text(json.dumps(config))
    report = validate(out)
    assert "x.cuda_graph" in [f.rule for f in report.errors], report.format()


def test_validator_warns_when_a_cuda_export_lost_its_images(checkpoint, tmp_path):
    out = export(checkpoint, tmp_path / "out", execution_provider="cuda", cuda_archs=[90], mtp=False, progress=False)
    for image in (out / library.IMAGE_FOLDER).iterdir():
        image.unlink()
    report = validate(out)
    assert report.ok and [f.rule for f in report.warnings] == ["x.cuda_images"], report.format()


def test_a_pool_og_cannot_size_is_refused_by_the_validator_and_og(checkpoint, tmp_path):
    """og.Engine 0.18 sizes an unset pool only from gpu_utilization_factor; without it the budget is zero, on CPU
    and on a GPU alike (the -e cuda export writes the factor for that reason)."""
    out = export(checkpoint, tmp_path / "out", paged=True, state_update_capacity=3, block_size=16, mtp=False,
                 progress=False)
    og.Engine(og.Model(str(out)))  # the default pool (num_blocks) loads
    config = config_of(out)
    del config["engine"]["dynamic_batching"]["num_blocks"]
    (out / "genai_config.json").write_text(json.dumps(config))
    assert [f.rule for f in validate(out).errors] == ["engine.num_blocks"]
    with pytest.raises(Exception, match="key-value cache budget is too small"):
        og.Engine(og.Model(str(out)))


def op_types(out, name="model.onnx"):
    return {node.op_type for node in onnx.load(str(out / name), load_external_data=False).graph.node}


def test_projections_are_linear_only_where_no_drafts_are_verified(checkpoint, tmp_path, caplog):
    """docs/op-contract.md#linear: the one-row CUDA kernel and cuBLAS round a row differently, so exports that verify
    drafts (an MTP head, state-update capacity) keep Gemm unless asked, and are warned when asked."""
    plain = export(checkpoint, tmp_path / "plain", execution_provider="cuda", mtp=False, progress=False)
    assert "Linear" in op_types(plain) and "Gemm" not in op_types(plain)
    with_head = export(checkpoint, tmp_path / "head", execution_provider="cuda", progress=False)
    assert "Linear" not in op_types(with_head) and "Linear" not in op_types(with_head, "mtp.onnx")
    caplog.clear()
    forced = export(checkpoint, tmp_path / "forced", execution_provider="cuda", linear_op=True, progress=False)
    assert "Linear" in op_types(forced) and "Linear" in op_types(forced, "mtp.onnx")
    assert "Linear (--linear-op) computes a one-row decode step with its own kernel" in caplog.text
    assert validate(forced).ok
    fp32 = export(checkpoint, tmp_path / "fp32", execution_provider="cuda", dtype="fp32", mtp=False, progress=False)
    assert "Linear" not in op_types(fp32)


@pytest.mark.parametrize("layout", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_gated_norm_is_one_node_on_cuda_and_separate_nodes_on_the_cpu(layout, tmp_path):
    """docs/model.md#gated-rmsnorm: -e cuda writes each GatedDeltaNet output norm as one com.microsoft::GatedRMSNorm
    (one CUDA launch instead of three); CPU exports keep RMSNormalization, Sigmoid and the products, which ORT's CPU
    kernels run faster. Both compute the same greedy tokens and, in fp32, logits within rounding (the fp32 -e cuda
    export runs on the CPU here: every node has a CPU kernel), in the dense, MoE and Qwen3-Next layouts."""
    checkpoint = make_tiny_checkpoint(tmp_path / "hf", layout, seed=1)
    cuda = export(checkpoint, tmp_path / "cuda", execution_provider="cuda", dtype="fp32", mtp=False, progress=False)
    cpu = export(checkpoint, tmp_path / "cpu", mtp=False, progress=False, kv_cache="concat")
    config = json.loads((checkpoint / "config.json").read_text())
    gdn_layers = config.get("text_config", config)["layer_types"].count("linear_attention")
    nodes = onnx.load(str(cuda / "model.onnx"), load_external_data=False).graph.node
    norms = [n for n in nodes if n.op_type == "GatedRMSNorm"]
    assert len(norms) == gdn_layers > 0 and all(n.domain == contract.MS_DOMAIN for n in norms)
    assert "GatedRMSNorm" not in op_types(cpu) and "Sigmoid" in op_types(cpu)
    prompts = [[5, 17, 33, 2, 99, 64, 7], [44, 3, 150]]
    ours = GreedyDriver(make_session(cuda, contract.DOMAIN)).generate(prompts, 8)
    reference = GreedyDriver(make_session(cpu, contract.DOMAIN)).generate(prompts, 8)
    assert ours.tokens == reference.tokens
    np.testing.assert_allclose(ours.prefill_logits, reference.prefill_logits, rtol=0, atol=1e-4)


def test_int4_projections_are_quantized_linear_on_cuda_where_asked(checkpoint, tmp_path):
    """docs/op-contract.md#quantizedlinear: a -e cuda int4 export that verifies no drafts and is not paged keeps
    MatMulNBits (its one-row kernel is the faster at batch 1); a paged one (og.Engine batches its requests) takes
    QuantizedLinear, and so does any with --linear-op: each 4-bit projection one QuantizedLinear (SwiGLU MLPs with
    activation swiglu, packed projections with an output per part); --no-linear-op keeps MatMulNBits in a paged
    export; CPU exports below accuracy level 4 keep MatMulNBits. Forced on an fp32 -e cuda export (which runs on the CPU here), it computes
    the greedy tokens and logits of the CPU export's MatMulNBits at accuracy_level 0."""
    plain = export(checkpoint, tmp_path / "plain", execution_provider="cuda", weights="int4", mtp=False,
                   progress=False)
    assert "MatMulNBits" in op_types(plain) and "QuantizedLinear" not in op_types(plain)
    paged = export(checkpoint, tmp_path / "paged", execution_provider="cuda", weights="int4", mtp=False,
                   paged=True, block_size=16, progress=False)
    assert "QuantizedLinear" in op_types(paged) and "MatMulNBits" not in op_types(paged)
    assert validate(paged).ok
    paged_nbits = export(checkpoint, tmp_path / "paged-nbits", execution_provider="cuda", weights="int4", mtp=False,
                         paged=True, block_size=16, linear_op=False, progress=False)
    assert "MatMulNBits" in op_types(paged_nbits) and "QuantizedLinear" not in op_types(paged_nbits)
    cuda = export(checkpoint, tmp_path / "cuda", execution_provider="cuda", weights="int4", mtp=False,
                  linear_op=True, progress=False)
    types = op_types(cuda)
    assert "QuantizedLinear" in types and "MatMulNBits" not in types
    nodes = onnx.load(str(cuda / "model.onnx"), load_external_data=False).graph.node
    attributes = [{a.name for a in n.attribute} for n in nodes if n.op_type == "QuantizedLinear"]
    assert any("activation" in a for a in attributes) and any("output_features" in a for a in attributes)
    assert validate(cuda).ok
    cpu = export(checkpoint, tmp_path / "cpu", weights="int4", accuracy_level=0, mtp=False, progress=False,
                 kv_cache="concat")
    assert "MatMulNBits" in op_types(cpu) and "QuantizedLinear" not in op_types(cpu)
    fp32 = export(checkpoint, tmp_path / "fp32", execution_provider="cuda", dtype="fp32", weights="int4",
                  accuracy_level=0, linear_op=True, mtp=False, progress=False)
    assert "QuantizedLinear" in op_types(fp32)
    assert_greedy_like_the_cpu_export(fp32, cpu)


def test_int4_exports_that_verify_drafts_take_quantized_linear(checkpoint, tmp_path, caplog):
    """QuantizedLinear's rows do not depend on the rows beside them (up to 64 a step), so a -e cuda int4 export with
    an MTP head writes it by default, in the head too, while its projections in the activation type stay Gemm; the
    warning names what is left to ORT's kernels, and goes once the lm_head and the gates are quantized too. int8
    stays MatMulNBits, with its own warning."""
    head = export(checkpoint, tmp_path / "head", execution_provider="cuda", weights="int4", progress=False)
    for name in ("model.onnx", "mtp.onnx"):
        types = op_types(head, name)
        assert "QuantizedLinear" in types and "MatMulNBits" not in types and "Linear" not in types, name
    assert ("but the lm_head (--quantize-lm-head), the GatedDeltaNet's b and a gates (--quantize-gates) run on "
            "ORT's CUDA kernels") in caplog.text
    assert validate(head).ok
    caplog.clear()
    export(checkpoint, tmp_path / "all", execution_provider="cuda", weights="int4", quantize_lm_head=True,
           quantize_gates=True, progress=False)
    assert "may leave plain decoding's tokens" not in caplog.text
    int8 = export(checkpoint, tmp_path / "int8", execution_provider="cuda", weights="int8", progress=False)
    assert "MatMulNBits" in op_types(int8) and "QuantizedLinear" not in op_types(int8)
    assert "MatMulNBits computes a row alone (decode) and among others (verify)" in caplog.text


def assert_greedy_like_the_cpu_export(ours_dir, cpu_dir):
    """Greedy tokens equal to the CPU MatMulNBits export's, logits within 1e-4 of their scale (fp32 sums in other
    orders, layer after layer)."""
    prompts = [[5, 17, 33, 2, 99, 64, 7], [44, 3, 150]]
    ours = GreedyDriver(make_session(ours_dir, contract.DOMAIN)).generate(prompts, 8)
    reference = GreedyDriver(make_session(cpu_dir, contract.DOMAIN)).generate(prompts, 8)
    assert ours.tokens == reference.tokens
    scale = np.abs(reference.prefill_logits).max()
    assert np.abs(np.asarray(ours.prefill_logits) - reference.prefill_logits).max() <= 1e-4 * scale


@pytest.mark.parametrize("layout", ["qwen3_5_moe_text", "qwen3_next"])
def test_int4_quantized_linear_in_the_moe_and_qwen3_next_layouts(layout, tmp_path):
    """The same in the MoE layout (the routed experts stay one QMoE; the shared expert is a QuantizedLinear SwiGLU)
    and Qwen3-Next's (packed in_proj_qkvz / in_proj_ba as outputs of one node)."""
    checkpoint = make_tiny_checkpoint(tmp_path / "hf", layout, seed=1)
    fp32 = export(checkpoint, tmp_path / "fp32", execution_provider="cuda", dtype="fp32", weights="int4",
                  accuracy_level=0, linear_op=True, mtp=False, progress=False)
    types = op_types(fp32)
    assert "QuantizedLinear" in types and "MatMulNBits" not in types and "QMoE" in types
    cpu = export(checkpoint, tmp_path / "cpu", weights="int4", accuracy_level=0, mtp=False, progress=False,
                 kv_cache="concat")
    assert_greedy_like_the_cpu_export(fp32, cpu)
