"""onnxruntime-genai 0.18's Engine on CPU over our paged export (issue 7, points 2-3): GDN, conv and
PagedAttention all run on our library, four concurrent greedy requests of different prompt lengths get
external drafts that are partly wrong, and the Engine commits partial accepts by replaying our compact
capsules (docs/genai-config.md#mtp-drafter). The tokens must equal transformers' greedy tokens and the Engine's own
plain (draft-free) decoding; a model whose capsules are zeroed (negative control) must diverge.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.cli import export_main  # noqa: E402
from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.exporter.kv_pool import DEFAULT_POOL_REQUESTS  # noqa: E402
from onnx_hybrid.exporter.model_config import load_model_config  # noqa: E402
from onnx_hybrid_testing.checkpoints import load_reference, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.engine import set_eos, tamper_capsules  # noqa: E402
from onnx_hybrid_testing.genai_driver import run_engine  # noqa: E402

LAYOUT = "qwen3_5_text"
PROMPT_LENGTHS = (12, 4, 25, 1)
PROMPTS = [[(7 * i + 3 * b) % 150 + 1 for i in range(n)] for b, n in enumerate(PROMPT_LENGTHS)]
NEW_TOKENS = 30
BLOCK_SIZE, NUM_BLOCKS = 16, 32
# onnxruntime-genai 0.18 verifies at most 7 drafts per step: at capacity 8 it reports a draft width of 7
# (measured; capacities 1..7 report themselves).
MAX_ENGINE_DRAFTS = 7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint") / LAYOUT, LAYOUT, seed=5)


@pytest.fixture(scope="module")
def reference_tokens(checkpoint):
    hf = load_reference(checkpoint)
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                            do_sample=False)[0, len(p):].tolist() for p in PROMPTS]


@pytest.fixture(scope="module")
def packages(checkpoint, reference_tokens, tmp_path_factory):
    """Paged exports with capacities 1, 3 and 8, default options (our PagedAttention), and an EOS that
    neither the prompts nor the references contain, so every request runs its full length."""
    vocab = load_model_config(checkpoint).vocab_size
    eos = max(set(range(vocab)) - {t for seq in PROMPTS + reference_tokens for t in seq})
    root = tmp_path_factory.mktemp("packages")
    out = {}
    for capacity in (1, 3, 8):
        out[capacity] = export(checkpoint, root / f"c{capacity}", state_update_capacity=capacity, paged=True,
                               block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, progress=False)
        set_eos(out[capacity], eos)
    return out


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_drafted_requests_equal_plain_decoding_and_transformers(capacity, packages, reference_tokens):
    plain = run_engine(packages[capacity], PROMPTS, NEW_TOKENS)
    assert plain.tokens == reference_tokens
    assert plain.stats.get("rounds", 0) == 0

    drafted = run_engine(packages[capacity], PROMPTS, NEW_TOKENS, drafts_from=reference_tokens)
    assert drafted.draft_width == min(capacity, MAX_ENGINE_DRAFTS)
    assert drafted.tokens == reference_tokens
    stats = drafted.stats
    histogram = stats["acceptance_length_histogram"]
    # Every non-full round with drafts replays kept = 1 + accepted transitions from our capsules.
    assert stats["zero_accept_rounds"] > 0 and stats["full_accept_rounds"] > 0, stats
    if capacity > 1:  # with one draft a round accepts all or nothing
        assert stats["partial_accept_rounds"] > 0 and histogram[1] > 0, stats
    assert histogram[drafted.draft_width] == stats["full_accept_rounds"], stats
    assert stats["target_forward_passes"] < NEW_TOKENS, stats


def test_zeroed_capsules_diverge(packages, reference_tokens, tmp_path):
    """Negative control: the same export with its GDN capsules zeroed still loads, validates and drafts,
    but every replayed commit rebuilds a zero recurrent state, so the tokens leave the reference."""
    tampered = tamper_capsules(packages[3], tmp_path / "tampered")
    run = run_engine(tampered, PROMPTS, NEW_TOKENS, drafts_from=reference_tokens)
    assert run.stats["partial_accept_rounds"] > 0
    diverged = [got != want for got, want in zip(run.tokens, reference_tokens)]
    assert all(diverged), diverged  # measured: first at generated tokens 8, 8, 6 and 8


def test_default_flags_size_the_pool_for_the_cpu_engine(checkpoint, reference_tokens, tmp_path):
    """`export-hybrid --paged --state-update-capacity 3` without --num-blocks: the export sizes the pool for
    DEFAULT_POOL_REQUESTS full-context requests (without num_blocks og.Engine on CPU fails: 'The key-value cache
    budget is too small to hold the reserved decoder state.'), and the Engine generates the reference tokens."""
    out = tmp_path / "default"
    assert export_main([str(checkpoint), "-o", str(out), "--paged", "--state-update-capacity", "3", "-q"]) == 0
    config = json.loads((out / "genai_config.json").read_text())
    context, pool = config["model"]["context_length"], config["engine"]["dynamic_batching"]
    assert pool["num_blocks"] == DEFAULT_POOL_REQUESTS * -(-context // pool["block_size"])
    set_eos(out, max(set(range(config["model"]["vocab_size"])) - {t for s in PROMPTS + reference_tokens for t in s}))
    assert run_engine(out, PROMPTS, NEW_TOKENS).tokens == reference_tokens
