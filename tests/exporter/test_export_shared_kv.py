"""``--kv-cache shared``: full attention as GroupQueryAttention over past/present buffers onnxruntime-genai 0.18
shares in place (``past_present_share_buffer: true``, what its CUDA graph capture needs), on CPU.

Every tiny layout, against transformers' greedy tokens (fp32, token for token): through our greedy driver on a
left-padded batch of two prompts of different lengths, and through og.Generator one prompt at a time. On a
batch og 0.18 feeds our model type an all-ones attention_mask whatever the pad id (it marks no left padding),
so the batched og run is held to the concat export's tokens on the same feeds, not to transformers'.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
og = pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.configs import validate  # noqa: E402
from onnx_hybrid.exporter import ExportError, export  # noqa: E402
from onnx_hybrid.exporter.model_config import FULL, load_model_config  # noqa: E402
from onnx_hybrid.exporter.mtp import head_overlay  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.engine import set_eos  # noqa: E402
from onnx_hybrid_testing.graph_count import decode_step_nodes  # noqa: E402
from onnx_hybrid_testing.greedy import GreedyDriver, make_session  # noqa: E402
from onnx_hybrid_testing.genai_driver import greedy_tokens  # noqa: E402
from test_export_e2e import LOGITS_TOL, NEW_TOKENS, PROMPTS, Reference  # noqa: E402

CASES = {
    "qwen3_5_text": ("qwen3_5_text", dict(tied=True)),
    "qwen3_5_multimodal": ("qwen3_5_multimodal", dict(tied=False)),
    "qwen3_5_moe_text-per_expert": ("qwen3_5_moe_text", dict(tied=False)),
    "qwen3_5_moe_text-fused": ("qwen3_5_moe_text", dict(tied=True, fused_experts=True)),
    "qwen3_next": ("qwen3_next", dict(tied=False)),
}
HKV, D = 2, 32  # testing.checkpoints geometry
NEVER_GENERATED = 159


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(checkpoint, transformers reference, shared export, concat export) of one layout."""
    layout, options = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    model_dir = make_tiny_checkpoint(root / "hf", layout, seed=1, **options)
    shared = export(model_dir, root / "shared", kv_cache="shared", progress=False)
    concat = export(model_dir, root / "concat", kv_cache="concat", progress=False)
    return model_dir, Reference(model_dir), shared, concat


def _expected(out, tokens):
    """``tokens`` up to the first EOS/pad id of the export: where og.Generator stops."""
    model = json.loads((out / "genai_config.json").read_text())["model"]
    stops = set(np.atleast_1d(model["eos_token_id"]).tolist()) | {model["pad_token_id"]}
    ends = [i for i, t in enumerate(tokens) if t in stops]
    return tokens[:ends[0]] if ends else tokens


def test_driver_matches_transformers_on_a_left_padded_batch(case):
    _, ref, shared, _ = case
    result = GreedyDriver(make_session(shared, contract.DOMAIN)).generate(PROMPTS, NEW_TOKENS)
    assert result.tokens == ref.tokens
    for row in range(len(PROMPTS)):
        np.testing.assert_allclose(result.prefill_logits[row, -1], ref.last_logits[row], atol=LOGITS_TOL, rtol=0)


def test_capture_style_mask_gives_the_same_tokens(case):
    """Under CUDA graph capture onnxruntime-genai feeds one attention_mask of the whole max_length (zeros beyond
    the tokens so far) instead of a growing one: the shared export finds each step's columns either way."""
    _, ref, shared, _ = case
    driver = GreedyDriver(make_session(shared, contract.DOMAIN))
    for prompt, tokens in zip(PROMPTS, ref.tokens):  # one row: GQA reads the wide mask as past context
        static = driver.generate([prompt], NEW_TOKENS, static_mask=True)
        assert static.tokens == [tokens]
        np.testing.assert_allclose(static.prefill_logits[0, -1], ref.last_logits[PROMPTS.index(prompt)],
                                   atol=LOGITS_TOL, rtol=0)
    rows = [PROMPTS[0][:4], PROMPTS[1][:4]]  # several rows: a first prompt, whatever the mask's width
    assert driver.generate(rows, NEW_TOKENS, static_mask=True).tokens == driver.generate(rows, NEW_TOKENS).tokens


def test_onnxruntime_genai_matches_transformers(case):
    _, ref, shared, concat = case
    model = og.Model(str(shared))
    for prompt, tokens in zip(PROMPTS, ref.tokens):
        expected = _expected(shared, tokens)
        assert len(expected) >= 4, "the reference stops too early to tell anything"
        assert greedy_tokens(model, prompt, NEW_TOKENS) == expected
    batched = {out.name: _genai_batch(out) for out in (shared, concat)}
    assert batched["shared"] == batched["concat"]


def _genai_batch(out) -> list[list[int]]:
    width = max(len(p) for p in PROMPTS)
    ids = np.zeros((len(PROMPTS), width), np.int32)
    for row, prompt in enumerate(PROMPTS):
        ids[row, width - len(prompt):] = prompt
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, batch_size=len(PROMPTS), max_length=width + NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(row)][width:] for row in range(len(PROMPTS))]


def test_graph_config_and_validator(case, tmp_path):
    model_dir, _, shared, _ = case
    config = json.loads((shared / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    graph = onnx.load(str(shared / "model.onnx"), load_external_data=False).graph
    full_layers = [i for i, kind in enumerate(load_model_config(model_dir).layer_types) if kind == FULL]
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert [n.domain for n in gqa] == [contract.MS_DOMAIN] * len(full_layers)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}
    for layer in full_layers:
        for name in (f"past_key_values.{layer}.key", f"present.{layer}.value"):
            assert dims[name] == ["batch_size", HKV, "max_sequence_length", D]
    assert validate(shared).ok, validate(shared).format()
    with_capacity = export(model_dir, tmp_path / "capacity", kv_cache="shared", state_update_capacity=2,
                           progress=False)
    assert validate(with_capacity).ok, validate(with_capacity).format()


def test_onnxruntime_genai_binds_every_state_in_place(case):
    """With past_present_share_buffer, og 0.18 binds one buffer as past and present for the GatedDeltaNet
    states too (not only KV): right after the prefill the past inputs already hold what the run wrote. Our ops
    take aliased states (test_native_*); the concat export gets separate buffers (past still zero)."""
    _, _, shared, concat = case
    prompt = PROMPTS[0]
    for out, aliased in ((shared, True), (concat, False)):
        model = og.Model(str(out))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + 4)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        for name in ("0.conv", "0.recurrent"):
            past = np.asarray(generator.get_input(f"past.{name}"))
            present = np.asarray(generator.get_output(f"present.{name}"))
            assert np.any(present)
            assert np.array_equal(past, present) is aliased, (out.name, name)


def test_decode_step_has_fewer_nodes_than_concat(tmp_path):
    """Per full-attention layer the shared graph saves more nodes than its preamble adds (row alignment vs the
    concat graph's mask bias): 9 layers, 3 of them full attention, are enough to show it."""
    model_dir = make_tiny_checkpoint(tmp_path / "hf", "qwen3_5_text", seed=1, layers=9)
    counts = {}
    for kv in ("shared", "concat"):
        out = export(model_dir, tmp_path / kv, kv_cache=kv, progress=False)
        counts[kv] = decode_step_nodes(out / "model.onnx", tmp_path / f"{kv}.optimized.onnx")
    assert counts["shared"]["graph"] < counts["concat"]["graph"], counts
    assert counts["shared"]["optimized"] < counts["concat"]["optimized"], counts
    assert counts["shared"]["optimized_ops"]["GroupQueryAttention"] == 3


def test_bad_shared_kv_requests_fail_before_any_work(tmp_path):
    with pytest.raises(ExportError, match="kv_cache='shared'.*non-paged"):
        export(tmp_path / "unused", tmp_path / "out", paged=True, kv_cache="shared", progress=False)
    with pytest.raises(ExportError, match="on CUDA needs --dtype fp16 or bf16"):
        export(tmp_path / "unused", tmp_path / "out", execution_provider="cuda", dtype="fp32", kv_cache="shared",
               progress=False)
    with pytest.raises(ExportError, match="kv_cache must be one of concat, shared, got 'ring'"):
        export(tmp_path / "unused", tmp_path / "out", kv_cache="ring", progress=False)


# --- the MTP head -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtp_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    model_dir = make_tiny_checkpoint(root / "hf", "qwen3_5_multimodal", tied=True, seed=3, mtp=True)
    out = export(model_dir, root / "shared", kv_cache="shared", logits_dtype="fp16", progress=False)
    set_eos(out, NEVER_GENERATED)
    return out


def test_mtp_head_uses_the_shared_layout(mtp_export):
    graph = onnx.load(str(mtp_export / "mtp.onnx"), load_external_data=False).graph
    assert [n.domain for n in graph.node if n.op_type == "GroupQueryAttention"] == [contract.MS_DOMAIN]
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert dims["past_key_values.0.key"] == ["batch_size", HKV, "max_sequence_length", D]
    assert validate(mtp_export).ok, validate(mtp_export).format()


def test_mtp_generator_keeps_greedy_tokens(mtp_export):
    """og.MtpGenerator drafts with the head over its shared KV buffer and rolls rejected drafts back: the
    tokens stay those of the plain Generator (fp16 logits: docs/genai-config.md#runtime-pitfalls-the-export-avoids)."""
    main = og.Model(str(mtp_export))
    head_config = og.Config(str(mtp_export))
    head_config.overlay(json.dumps(head_overlay(json.loads((mtp_export / "genai_config.json").read_text()))))
    head = og.Model(head_config)
    evaluated = 0
    for prompt in PROMPTS:
        expected = greedy_tokens(main, prompt, NEW_TOKENS)
        for drafts in (1, 3):
            params = og.GeneratorParams(main)
            params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
            params.set_speculative_options(max_draft_tokens=drafts)
            generator = og.MtpGenerator(main, head, params)
            generator.append_tokens(prompt)
            while not generator.is_done():
                generator.generate_next_token()
            assert [int(t) for t in generator.get_sequence()][len(prompt):] == expected, (prompt, drafts)
            evaluated += generator.get_stats()["draft_tokens_evaluated"]
    assert evaluated > 0
