"""End to end: tiny random HF checkpoints of every layout -> export -> ONNX Runtime, against transformers.

Reference: transformers' ``generate(do_sample=False)`` in fp32, one prompt at a time (no padding).
The exports run a left-padded batch of both prompts through the greedy driver (what
onnxruntime-genai feeds), so padding exactness is checked on every layout.

Tolerance for the prefill logits: 1e-4 absolute (logits are O(10) here) at the last position; over all
positions also 1e-5 relative, because ORT's MoE kernel sums experts in another order than HF. HF in fp32
is itself ~5e-5 away from float64 on these checkpoints, so this is fp32 rounding, not a convention.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import GDN_HEADS, load_reference, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.greedy import GreedyDriver, make_session  # noqa: E402
from onnx_hybrid_testing.genai_driver import greedy_tokens  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150], [44, 3, 150, 12, 9]]
NEW_TOKENS = 16
LOGITS_TOL = 1e-4

# id: (layout, options of make_tiny_checkpoint)
CASES = {
    "qwen3_5_text-tied": ("qwen3_5_text", dict(tied=True)),
    "qwen3_5_multimodal-untied-sharded": ("qwen3_5_multimodal", dict(tied=False, shard_size="150KB")),
    "qwen3_5_moe_text-per_expert": ("qwen3_5_moe_text", dict(tied=False)),
    "qwen3_5_moe_multimodal-fused": ("qwen3_5_moe_multimodal", dict(tied=True, fused_experts=True)),
    "qwen3_next-packed-sharded": ("qwen3_next", dict(tied=False, shard_size="150KB")),
}


class Reference:
    def __init__(self, model_dir):
        model = load_reference(model_dir)
        self.tokens, self.last_logits = [], []
        with torch.no_grad():
            for prompt in PROMPTS:
                ids = torch.tensor([prompt])
                out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
                self.tokens.append(out[0, len(prompt):].tolist())
                self.last_logits.append(model(ids).logits[0, -1].numpy())
        self.full_logits = model(torch.tensor([PROMPTS[0]])).logits[0].detach().numpy()


_BUILT = {}


def _case(name, tmp_path_factory):
    if name not in _BUILT:
        layout, options = CASES[name]
        model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(name) / "hf", layout, seed=1, **options)
        _BUILT[name] = (name, model_dir, Reference(model_dir))
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def text_case(tmp_path_factory):
    """The plain text-only layout, for checks that do not depend on the layout."""
    return _case("qwen3_5_text-tied", tmp_path_factory)


def _greedy(out_dir, domain=contract.DOMAIN, **kwargs):
    return GreedyDriver(make_session(out_dir, domain)).generate(PROMPTS, NEW_TOKENS, **kwargs)


@pytest.mark.parametrize("linear_op", [False, True], ids=["gemm", "linear"])
def test_layout_matches_transformers(case, tmp_path, linear_op):
    """Projections as ONNX's Gemm or as our Linear (the CUDA exports' default; here its CPU kernel), the SwiGLU
    products then as Linear(activation=swiglu) and packed projections as one Linear with an output per part."""
    name, model_dir, ref = case
    out = export(model_dir, tmp_path / "onnx", progress=False, linear_op=linear_op)
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    op_types = {node.op_type for node in graph.node}
    assert ("Linear" in op_types, "Gemm" in op_types) == (linear_op, not linear_op)
    # Each SwiGLU (the dense MLPs, MoE shared experts) is one Linear with activation swiglu, not a Split/SiLU/Mul
    swiglu = [n for n in graph.node if any(a.name == "activation" and a.s == b"swiglu" for a in n.attribute)]
    assert bool(swiglu) == linear_op and all(n.op_type == "Linear" for n in swiglu)
    # and packed projections give their parts as the Linear's outputs: no Split after a Linear
    linear_outputs = {o for n in graph.node if n.op_type == "Linear" for o in n.output}
    assert not [n.name for n in graph.node if n.op_type == "Split" and n.input[0] in linear_outputs]
    assert any(len(n.output) > 1 for n in graph.node if n.op_type == "Linear") == linear_op
    result = _greedy(out)
    assert result.tokens == ref.tokens
    # Row 1 is left-padded in the batch; its last position is still the prompt's last token.
    for row in range(len(PROMPTS)):
        np.testing.assert_allclose(result.prefill_logits[row, -1], ref.last_logits[row], atol=LOGITS_TOL, rtol=0)
    if "multimodal" in name:  # vision tower and MTP weights are skipped
        assert not [i.name for i in graph.initializer if "visual" in i.name or i.name.startswith("mtp.")]


def test_all_logits_and_ort_kernels(case, tmp_path):
    """Every prefill position, on ONNX Runtime's own com.microsoft kernels (ORT >= 1.32 CPU)."""
    _, model_dir, ref = case
    out = export(model_dir, tmp_path / "onnx", op_domain=contract.MS_DOMAIN, all_logits=True, progress=False)
    driver = GreedyDriver(make_session(out, contract.MS_DOMAIN))
    result = driver.generate(PROMPTS[:1], NEW_TOKENS)
    assert result.tokens == ref.tokens[:1]
    np.testing.assert_allclose(result.prefill_logits[0], ref.full_logits, atol=LOGITS_TOL, rtol=1e-5)


@pytest.mark.parametrize("capacity", [1, 3])
def test_state_update_capacity_keeps_tokens(text_case, tmp_path, capacity):
    _, model_dir, ref = text_case
    out = export(model_dir, tmp_path / "onnx", state_update_capacity=capacity, progress=False)
    result = _greedy(out, capture_count=capacity)
    assert result.tokens == ref.tokens
    with open(out / "genai_config.json") as f:
        decoder = json.load(f)["model"]["decoder"]
    assert decoder["state_update_capacity"] == capacity
    layers = decoder["state_groups"][0]["layer_ids"]
    hv, hk, dk, dv = GDN_HEADS
    for step in result.extra_outputs:
        for layer in layers:
            assert step[f"state_update.{layer}.conv_value"].shape == (2, capacity, 2 * hk * dk + hv * dv)
            assert step[f"state_update.{layer}.recurrent_capsule"].shape == (
                2, contract.gdn_capsule_width(capacity, *GDN_HEADS))


@pytest.mark.parametrize("dtype", ["fp16"])
def test_half_precision_keeps_state_fp32(text_case, tmp_path, dtype):
    _, model_dir, ref = text_case
    out = export(model_dir, tmp_path / "onnx", dtype=dtype, progress=False)
    session = make_session(out, contract.DOMAIN)
    types = {v.name: v.type for v in session.get_inputs() + session.get_outputs()}
    assert types["past.0.recurrent"] == types["present.0.recurrent"] == "tensor(float)"
    assert types["past.0.conv"] == types["logits"] == "tensor(float16)"
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    consumed = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    assert [n.op_type for n in graph.node if not consumed.intersection(n.output)] == []  # no dead fp16 branch
    # fp16 rounding may flip a late near-tie; the first tokens must agree.
    assert GreedyDriver(session).generate(PROMPTS, NEW_TOKENS).tokens[0][:4] == ref.tokens[0][:4]


def test_onnxruntime_genai_generates_reference_tokens(case, tmp_path):
    """The real client: onnxruntime-genai 0.18 loads the export (our library via session_options)."""
    _genai_matches(case, tmp_path, contract.DOMAIN)


def test_onnxruntime_genai_with_ort_kernels(text_case, tmp_path):
    _genai_matches(text_case, tmp_path, contract.MS_DOMAIN)


def _genai_matches(case, tmp_path, domain):
    og = pytest.importorskip("onnxruntime_genai")
    _, model_dir, ref = case
    out = export(model_dir, tmp_path / "onnx", op_domain=domain, progress=False)
    model = og.Model(og.Config(str(out)))
    genai_model = json.loads((out / "genai_config.json").read_text())["model"]
    eos = set(np.atleast_1d(genai_model["eos_token_id"]).tolist()) | {genai_model["pad_token_id"]}
    for prompt, expected in zip(PROMPTS, ref.tokens):
        # genai stops before its EOS/pad ids (the tiny checkpoints declare none, so pad 0 acts as one).
        stops = [i for i, t in enumerate(expected) if t in eos]
        expected = expected[:stops[0]] if stops else expected
        assert len(expected) >= 4, "the reference stops too early to tell anything"
        assert greedy_tokens(model, prompt, NEW_TOKENS) == expected


def test_onnxruntime_genai_feeds_2d_positions_and_growing_mask(text_case, tmp_path):
    """What genai 0.18 feeds our declared model.type: position_ids [B, S] (not M-RoPE's [3, B, S]), and
    the 2-D attention_mask over all tokens so far, which the graph uses for both masks."""
    og = pytest.importorskip("onnxruntime_genai")
    _, model_dir, _ = text_case
    out = export(model_dir, tmp_path / "onnx", progress=False)
    model = og.Model(og.Config(str(out)))
    params = og.GeneratorParams(model)
    prompt = PROMPTS[0]
    params.set_search_options(do_sample=False, max_length=len(prompt) + 4)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    np.testing.assert_array_equal(generator.get_input("position_ids"), [np.arange(len(prompt))])
    np.testing.assert_array_equal(generator.get_input("attention_mask"), np.ones((1, len(prompt))))
    generator.generate_next_token()
    generator.generate_next_token()  # runs the first single-token step
    np.testing.assert_array_equal(generator.get_input("position_ids"), [[len(prompt)]])
    np.testing.assert_array_equal(generator.get_input("attention_mask"), np.ones((1, len(prompt) + 1)))
