"""The MTP drafter export (mtp.onnx) and speculative decoding with it in onnxruntime-genai 0.18, on CPU.

The checkpoint is a tiny multimodal-wrapper Qwen3.5 with an MTP head added to its safetensors (transformers
drops ``mtp.*``). For the speculative runs the head is fitted to draft well (``testing.mtp.fit_drafting_head``:
its layer is the identity through the residual, ``fc`` the least-squares map from (embedding of the next
token, hidden) to the main model's next hidden). It is fitted on the first FIT_TOKENS greedy tokens of each
prompt only, so its drafts are right in that stretch and mostly wrong after it: runs then have full,
partial and zero accepts, and any replay or rollback error would change tokens.

Numerics of the head: float64 NumPy (docs/model.md#mtp-head) on random inputs; the head's output is
O(1) and fp32 rounding is ~1e-6, so 1e-4 absolute.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
og = pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.configs import validate  # noqa: E402
from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.exporter.mtp import head_overlay  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import load_reference, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.engine import set_eos  # noqa: E402
from onnx_hybrid_testing.genai_driver import run_engine  # noqa: E402
from onnx_hybrid_testing.greedy import make_session  # noqa: E402
from onnx_hybrid_testing.mtp import add_mtp_head, fit_drafting_head, greedy_runs, reference_head  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8], [44, 3, 150, 12],
           [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 1], [77]]
NEW_TOKENS, FIT_TOKENS = 30, 16
CAPACITY, MAX_DRAFT = 3, 3
NEVER_GENERATED = 159  # EOS and pad of the packages: the runs reach their length
TOL = 1e-4
H, V, HKV, D = 64, 160, 2, 32  # testing.checkpoints geometry


def _session(path):
    return make_session(path.parent, contract.DOMAIN, filename=path.name)


def _run(session, feeds):
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.fixture(scope="module")
def random_head(tmp_path_factory):
    """Untied embeddings, so both shared matrices (embedding and lm_head) are exercised."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("random") / "hf", "qwen3_5_multimodal", tied=False,
                                seed=3, mtp=True)


@pytest.fixture(scope="module")
def drafting(tmp_path_factory):
    """(checkpoint with a fitted head, greedy tokens of PROMPTS through our ORT export)."""
    root = tmp_path_factory.mktemp("drafting")
    hf = make_tiny_checkpoint(root / "hf", "qwen3_5_multimodal", tied=True, seed=3, mtp=True)
    runs = greedy_runs(export(hf, root / "fit", progress=False), PROMPTS, NEW_TOKENS, contract.DOMAIN)
    fit = [(tokens[:len(p) + FIT_TOKENS], hidden[:len(p) + FIT_TOKENS]) for (tokens, hidden), p in zip(runs, PROMPTS)]
    add_mtp_head(hf, fit_drafting_head(hf, fit))
    return hf, [tokens[len(p):] for (tokens, _), p in zip(runs, PROMPTS)]


@pytest.fixture(scope="module")
def transformers_tokens(drafting):
    hf = load_reference(drafting[0])
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                            do_sample=False)[0, len(p):].tolist() for p in PROMPTS]


# --- the export -----------------------------------------------------------------------------------


def test_head_matches_the_float64_head_and_reads_post_norm_hidden(random_head, tmp_path):
    out = export(random_head, tmp_path / "out", progress=False)
    rng = np.random.default_rng(0)
    s = 7
    tokens, hidden = rng.integers(0, V, s), rng.standard_normal((s, H)).astype(np.float32)
    head = _run(_session(out / "mtp.onnx"), {
        "input_ids": tokens[None], "attention_mask": np.ones((1, s), np.int64),
        "position_ids": np.arange(s)[None], "hidden_states": hidden[None],
        "past_key_values.0.key": np.zeros((1, HKV, 0, D), np.float32),
        "past_key_values.0.value": np.zeros((1, HKV, 0, D), np.float32)})
    logits, hidden_out = reference_head(random_head, tokens, hidden, np.arange(s))
    np.testing.assert_allclose(head["logits"][0], logits, atol=TOL, rtol=0)
    np.testing.assert_allclose(head["hidden_states_out"][0], hidden_out, atol=TOL, rtol=0)
    assert list(head["present.0.key"].shape) == [1, HKV, s, D]

    # The main model's hidden_states is what feeds lm_head (post final norm), at every position.
    main = _run(_session(out / "model.onnx"), _prefill_feeds(out, tokens.tolist()))
    lm_head = onnx.numpy_helper.to_array(_initializer(out / "model.onnx", "lm_head.weight"), str(out))
    assert main["logits"].shape == (1, s, V) and main["hidden_states"].shape == (1, s, H)
    np.testing.assert_allclose(main["logits"][0], main["hidden_states"][0] @ lm_head.T, atol=TOL, rtol=0)


def test_head_shares_the_main_models_embedding_and_lm_head(random_head, tmp_path):
    out = export(random_head, tmp_path / "out", progress=False)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        head, main = _initializer(out / "mtp.onnx", name), _initializer(out / "model.onnx", name)
        assert _location(head) == _location(main) and _location(head)["location"] == "model.onnx.data"
    head_files = {_location(t).get("location") for t in
                  onnx.load(str(out / "mtp.onnx"), load_external_data=False).graph.initializer}
    assert head_files <= {None, "mtp.onnx.data", "model.onnx.data"}  # inside the folder (ORT's rule)


def test_config_declares_the_head_for_both_routes(random_head, tmp_path):
    for paged in (False, True):
        out = export(random_head, tmp_path / f"paged{paged}", progress=False, paged=paged, block_size=16,
                     num_blocks=64, state_update_capacity=CAPACITY if paged else 0)
        config = json.loads((out / "genai_config.json").read_text())
        model = config["model"]
        assert model["decoder"]["outputs"]["hidden_states"] == "hidden_states"
        assert model["mtp"]["filename"] == "mtp.onnx" and model["mtp"]["num_hidden_layers"] == 1
        assert model["mtp"]["outputs"]["hidden_states"] == "hidden_states_out"
        assert model["mtp"]["session_options"] == model["decoder"]["session_options"]
        assert "shared_initializers" not in json.dumps(config)  # breaks CPU loading in 0.18
        assert config["speculative"]["max_draft_tokens"] == (CAPACITY if paged else 1)
        assert validate(out).ok, validate(out).format()
        og.Config(str(out))
        onnx.checker.check_model(str(out / "mtp.onnx"))


def test_paged_head_matches_the_float64_head_on_packed_requests(random_head, tmp_path):
    out = export(random_head, tmp_path / "out", progress=False, paged=True, block_size=16, num_blocks=4)
    rng = np.random.default_rng(1)
    lengths = [5, 3]
    tokens = [rng.integers(0, V, n) for n in lengths]
    hidden = [rng.standard_normal((n, H)).astype(np.float32) for n in lengths]
    pool = np.zeros((4, 16, HKV, D), np.float32)
    head = _run(_session(out / "mtp.onnx"), {
        "input_ids": np.concatenate(tokens), "position_ids": np.concatenate([np.arange(n) for n in lengths]),
        "hidden_states": np.concatenate(hidden), "past_key_values.0.key": pool, "past_key_values.0.value": pool.copy(),
        "block_table": np.array([[2], [0]], np.int32), "cumulative_sequence_lengths": np.array([0, 5, 8], np.int32),
        "past_sequence_lengths": np.zeros(2, np.int32), "attention_metadata": np.array([5, 5, 0], np.int32)})
    start = 0
    for t, h in zip(tokens, hidden):
        logits, hidden_out = reference_head(random_head, t, h, np.arange(len(t)))
        np.testing.assert_allclose(head["logits"][start:start + len(t)], logits, atol=TOL, rtol=0)
        np.testing.assert_allclose(head["hidden_states_out"][start:start + len(t)], hidden_out, atol=TOL, rtol=0)
        start += len(t)


def test_no_mtp_skips_the_head(random_head, tmp_path):
    out = export(random_head, tmp_path / "out", progress=False, mtp=False)
    assert not (out / "mtp.onnx").exists()
    config = json.loads((out / "genai_config.json").read_text())
    assert "mtp" not in config["model"] and "speculative" not in config
    outputs = [o.name for o in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.output]
    assert "hidden_states" not in outputs


@pytest.mark.parametrize("layout", ["qwen3_5_moe_multimodal", "qwen3_next"])
def test_moe_heads_route_through_the_moe_block(layout, tmp_path):
    """MoE checkpoints have an MoE MTP layer (Qwen3-Next's per-expert tensors included); the head's layer
    reuses the main layers' MoE builder, whose numerics test_export_e2e checks against transformers."""
    hf = make_tiny_checkpoint(tmp_path / "hf", layout, tied=False, seed=2, mtp=True)
    out = export(hf, tmp_path / "out", progress=False, paged=True, block_size=16, num_blocks=4)
    graph = onnx.load(str(out / "mtp.onnx"), load_external_data=False).graph
    [moe] = [n for n in graph.node if n.op_type == "MoE"]
    assert moe.input[2] == "mtp.layers.0.mlp.experts.gate_up_proj"
    head = _run(_session(out / "mtp.onnx"), {
        "input_ids": np.array([3, 4, 5]), "position_ids": np.arange(3), "hidden_states": np.ones((3, H), np.float32),
        "past_key_values.0.key": np.zeros((4, 16, HKV, D), np.float32),
        "past_key_values.0.value": np.zeros((4, 16, HKV, D), np.float32), "block_table": np.array([[1]], np.int32),
        "cumulative_sequence_lengths": np.array([0, 3], np.int32), "past_sequence_lengths": np.zeros(1, np.int32),
        "attention_metadata": np.array([3, 3, 0], np.int32)})
    assert head["logits"].shape == (3, V) and np.isfinite(head["logits"]).all()


# --- route B: the Engine hosts the head ----------------------------------------------------------


def test_engine_drafts_with_the_head_and_keeps_greedy_tokens(drafting, transformers_tokens, tmp_path):
    hf, ort_tokens = drafting
    assert ort_tokens == transformers_tokens
    out = export(hf, tmp_path / "out", progress=False, paged=True, state_update_capacity=CAPACITY, block_size=16,
                 num_blocks=64, max_draft_tokens=MAX_DRAFT)
    set_eos(out, NEVER_GENERATED)
    run = run_engine(out, PROMPTS, NEW_TOKENS)
    assert run.tokens == transformers_tokens
    stats = run.stats
    assert run.draft_width == CAPACITY and stats["draft_forward_passes"] > 0 and stats["mtp_failures"] == 0
    assert stats["partial_accept_rounds"] > 0 and stats["full_accept_rounds"] > 0, stats
    assert stats["target_forward_passes"] < NEW_TOKENS, stats


# --- route A: og.MtpGenerator with the non-paged export -------------------------------------------


def _generate(generator, prompt):
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()


def test_mtp_generator_keeps_greedy_tokens_with_fp16_logits(drafting, tmp_path):
    hf, _ = drafting
    out = export(hf, tmp_path / "out", progress=False, logits_dtype="fp16")
    set_eos(out, NEVER_GENERATED)
    main = og.Model(str(out))
    head_config = og.Config(str(out))
    head_config.overlay(json.dumps(head_overlay(json.loads((out / "genai_config.json").read_text()))))
    head = og.Model(head_config)
    accepted = 0
    for prompt in PROMPTS[:2]:
        params = og.GeneratorParams(main)
        params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
        plain = og.Generator(main, params)
        _generate(plain, prompt)
        expected = list(plain.get_sequence(0))
        for drafts in (1, 2, 4):
            params = og.GeneratorParams(main)
            params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
            params.set_speculative_options(max_draft_tokens=drafts)
            generator = og.MtpGenerator(main, head, params)
            _generate(generator, prompt)
            assert list(generator.get_sequence()) == expected, (prompt, drafts)
            stats = generator.get_stats()
            assert stats["draft_tokens_evaluated"] > stats["draft_tokens_accepted"]
            accepted += stats["draft_tokens_accepted"]
    assert accepted > 0


def test_mtp_generator_still_rejects_fp32_logits_on_cpu(drafting, tmp_path):
    """onnxruntime-genai 0.18's bug (docs/genai-config.md#runtime-pitfalls-the-export-avoids), the reason for
    --logits-dtype fp16: when this starts failing, the workaround can go."""
    out = export(drafting[0], tmp_path / "out", progress=False)
    main = og.Model(str(out))
    head_config = og.Config(str(out))
    head_config.overlay(json.dumps(head_overlay(json.loads((out / "genai_config.json").read_text()))))
    params = og.GeneratorParams(main)
    params.set_search_options(do_sample=False, max_length=20)
    generator = og.MtpGenerator(main, og.Model(head_config), params)
    with pytest.raises(Exception, match="Cast - input and output types are the same"):
        generator.append_tokens(PROMPTS[0])


# --- helpers ----------------------------------------------------------------------------------------


def _prefill_feeds(out, tokens):
    s = len(tokens)
    feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, s), np.int64),
             "position_ids": np.arange(s)[None]}
    for value in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.input:
        if value.name not in feeds:
            dims = [1 if d.dim_param == "batch_size" else 0 if d.dim_param else d.dim_value
                    for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = np.zeros(dims, np.float32)
    return feeds


def _initializer(path, name):
    return next(t for t in onnx.load(str(path), load_external_data=False).graph.initializer if t.name == name)


def _location(tensor):
    return {entry.key: entry.value for entry in tensor.external_data}

