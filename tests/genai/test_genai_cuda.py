"""onnxruntime-genai on the GPU, as a user runs it: every tiny layout exported with ``-e cuda``, then generated
by onnxruntime-genai-cuda in a fresh interpreter that never imports onnx_hybrid (the export's copy of the library
loads itself from genai_config.json and finds its CUDA kernels in ``onnx_hybrid_cuda/`` beside it).

* Non-paged exports through ``og.Generator`` and paged exports through ``og.Engine`` give transformers' greedy
  tokens: fp32 exports token for token; fp16 exports token for token where it matters, i.e. every token they pick
  is within ``FP16_LOGIT_TOL`` of the best fp32 logit of transformers on the same prefix.
* Speculative decoding on the GPU is lossless: the paged export with capacity 3 in og.Engine, with (a) partly
  wrong external drafts and (b) the exported MTP head drafting, several concurrent requests, gives the tokens of
  plain decoding and of transformers, with partial accepts; zeroed capsules diverge.

Needs onnxruntime-genai-cuda 0.18 and a GPU; skipped otherwise. ``ONNX_HYBRID_GENAI_TEST_PROVIDER=cpu`` runs the
same checks on onnxruntime-genai's CPU build (a dry run of this module on a host without a GPU).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing import genai_driver  # noqa: E402
from onnx_hybrid_testing.checkpoints import load_reference, make_tiny_checkpoint, with_weights_rounded  # noqa: E402
from onnx_hybrid_testing.engine import set_eos, tamper_capsules  # noqa: E402
from onnx_hybrid_testing.mtp import add_mtp_head, fit_drafting_head, greedy_runs  # noqa: E402

PROVIDER = os.environ.get("ONNX_HYBRID_GENAI_TEST_PROVIDER", "cuda")
# fp16 exports are held to logits, not tokens: the tiny random checkpoints have steps where fp16 rounding alone moves
# a logit by 3-5 (transformers' own fp16 run too: 4.8 at one step of the multimodal one; an MoE routing near-tie
# flips an expert), so a greedy token can leave the fp32 reference. Over every step of every prompt, teacher-forced
# on transformers' tokens, the RMS error of our fp16 logits must stay below this fraction of the logits' spread.
# Measured on an H100: 0.003-0.045, and 0.101-0.102 for the two prompts with such a step; a wrong kernel gives ~1.
FP16_REL_RMS_TOL = 0.15
# How far fp16 rounding alone can carry a prompt of a tiny checkpoint past a near-tie (an MoE routing choice, a
# gate): the most that FP16_NOISE_DRAWS draws of FP16_NOISE relative weight noise (2x fp16's unit roundoff) move
# its fp32 logits. On the checkpoints with weights rounded to int4/int8: 0.01-0.12, and 0.135, 0.33 and 0.44 for the
# three prompts on which the H100 runs of this test missed FP16_REL_RMS_TOL (by 0.17-0.38; all others < 0.09) while
# its oracle rounded with fp32 scales (since corrected: with_weights_rounded takes the export's dtype).
FP16_NOISE, FP16_NOISE_DRAWS = 1e-3, 4
# Two fp16 runs of one model on one GPU (og.Engine over the paged graph, og.Generator over the plain one) differ by
# fp16 rounding: where their greedy tokens part, the Engine's token is within this of the Generator's best logit,
# plus that step's own fp16 error against transformers' fp32 logits (measured: parted only at the steps above, by
# 1.2 and 2.9 where that error is 5.0; elsewhere the same tokens).
FP16_TIE_TOL = 0.25
# A routed token takes other experts where fp16 moves its router logits across a near-tie, and that step's logits
# then move by several units. Measured on the CPU (tiny MoE checkpoint, prompt of 4, fourth step): the paged fp16
# export's router logits 0.021 from transformers' fp32 in the last layer, where experts 2 and 5 were 0.015 apart; it
# took 5, and the step's logits moved by 5.1. Steps at which any layer's k-th and (k+1)-th router logits in
# transformers are closer than this are not held to FP16_TIE_TOL (1-3 of 16 on the tiny MoE checkpoints); the
# reference Generator's own flips need no allowance: they show in its error against transformers.
ROUTER_TIE_TOL = 0.03
PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8], [44, 3, 150, 12], [77]]
NEW_TOKENS = 16
VOCAB = 160  # testing.checkpoints geometry
BLOCK_SIZE = 16
# (id, layout, make_tiny_checkpoint options): dense, the multimodal wrapper, MoE per-expert and fused, Qwen3-Next.
LAYOUTS = [("dense", "qwen3_5_text", {}), ("multimodal", "qwen3_5_multimodal", {}),
           ("moe", "qwen3_5_moe_text", {}), ("moe_fused", "qwen3_5_moe_text", {"fused_experts": True}),
           ("next", "qwen3_next", {})]
# The layouts with routed experts: on CUDA their products are ORT's MoE / QMoE, which times its GEMM tactics when a
# session first runs them and keeps the fastest, so two sessions may sum in different orders.
ROUTED_EXPERTS = {"moe", "moe_fused", "next"}


def _gpu_arch() -> int | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    return int(line.replace(".", "")) if line.replace(".", "").isdigit() else None


def _skip_reason() -> str | None:
    if PROVIDER == "cpu":
        return None
    if not og.is_cuda_available():
        return "onnxruntime-genai has no CUDA support here (install onnxruntime-genai-cuda)"
    if _gpu_arch() is None:
        return "no NVIDIA GPU visible (nvidia-smi)"
    return None


SKIP = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def unused_token(*sequences) -> int:
    """A token none of the prompts and references holds: made EOS and pad, it lets every run reach its length."""
    return max(set(range(VOCAB)) - {t for seq in sequences for t in seq})


def export_for_test(checkpoint, out, eos: int, **options) -> Path:
    """Export as the user would for PROVIDER, with only this GPU's kernel image (the default set takes minutes
    to compile where no wheel ships it), then ``eos`` as the only EOS."""
    if PROVIDER == "cuda":  # the paged pool is sized by the runtime (gpu_utilization_factor)
        options.update(execution_provider="cuda", cuda_archs=[_gpu_arch()])
    elif options.get("paged"):  # the CPU dry run: our PagedAttention (ORT has its own on CUDA only)
        options.setdefault("num_blocks", 64)
        options.setdefault("paged_attention", contract.DOMAIN)
    path = export(checkpoint, out, progress=False, **options)
    set_eos(path, eos)
    return path


def genai(model: Path, mode: str, prompts, new_tokens: int = NEW_TOKENS, drafts_from=None, forced=None,
          cuda_graph: bool | None = None, environment: dict | None = None) -> dict:
    """Run onnxruntime-genai on ``model`` in a fresh interpreter that imports nothing of onnx_hybrid; ``cuda_graph``
    overrides the export's enable_cuda_graph (None keeps it); ``environment`` adds variables to the child's."""
    job = {"model": str(model), "mode": mode, "prompts": prompts, "new_tokens": new_tokens, "drafts_from": drafts_from,
           "forced": forced, "cuda_graph": cuda_graph}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ONNX_HYBRID_CUDA_IMAGES")}
    env.update(environment or {})
    path = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and not (Path(p) / "onnx_hybrid").is_dir())
    if path:  # keep carried site folders, drop the checkout: the child must not be able to import the package
        env["PYTHONPATH"] = path
    done = subprocess.run([sys.executable, genai_driver.__file__], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=600, cwd=model)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.pop("onnx_hybrid_imported") is False
    return result


def reference_tokens(hf, prompts, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                            do_sample=False)[0, len(p):].tolist() for p in prompts]


def exact(dtype: str, paged: bool) -> bool:
    """Whether tokens must equal transformers' one for one: fp32 exports, except paged ones on CUDA, whose pool is
    fp16 (ORT's CUDA PagedAttention has no fp32 kernel)."""
    return dtype == "fp32" and not (paged and PROVIDER == "cuda")


def transformers_logits(hf, prompts, continuations) -> list[np.ndarray]:
    """fp32 logits before each token of each continuation (teacher-forced), [steps, vocab] per prompt."""
    with torch.no_grad():
        return [hf(torch.tensor([p + c[:-1]])).logits[0, len(p) - 1:].double().numpy()
                for p, c in zip(prompts, continuations)]


def relative_rms(got, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(got, np.float64) - ref) ** 2)) / ref.std())


def fp16_sensitivity(hf, prompts, continuations) -> list[float]:
    """Per prompt, the largest relative RMS by which FP16_NOISE relative weight noise moves ``hf``'s fp32 logits
    over FP16_NOISE_DRAWS draws."""
    ref, worst = transformers_logits(hf, prompts, continuations), [0.0] * len(prompts)
    for draw in range(FP16_NOISE_DRAWS):
        noisy, generator = copy.deepcopy(hf), torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for weight in noisy.parameters():
                weight.mul_(1 + FP16_NOISE * torch.randn(weight.shape, generator=generator))
        moved = transformers_logits(noisy, prompts, continuations)
        worst = [max(w, relative_rms(a, b)) for w, a, b in zip(worst, moved, ref)]
    return worst


def assert_fp16_logits_close(hf, out: Path, want: list[list[int]]) -> None:
    """The fp16 export's logits, through og.Generator teacher-forced on transformers' greedy tokens, against
    transformers' fp32 logits: relative RMS over all steps of each prompt below FP16_REL_RMS_TOL."""
    got = genai(out, "forced", PROMPTS, forced=want)["logits"]
    for prompt, ours, ref in zip(PROMPTS, got, transformers_logits(hf, PROMPTS, want)):
        rel = relative_rms(ours, ref)
        print(f"fp16 relative RMS {out.name} prompt of {len(prompt)}: {rel:.4f}")  # shown with -s / -rP
        assert rel <= FP16_REL_RMS_TOL, (prompt, rel)


def routing_ties(hf, prompt, tokens) -> np.ndarray:
    """Per step of ``tokens`` after ``prompt`` (teacher-forced): whether, in transformers' fp32 run, some MoE layer's
    k-th and (k+1)-th router logits are within ROUTER_TIE_TOL at the position that picks the step's token."""
    ties = np.zeros(len(tokens), bool)
    k = getattr(hf.config, "num_experts_per_tok", None)
    if k is None:  # no routed experts
        return ties
    with torch.no_grad():
        routers = hf(torch.tensor([prompt + tokens[:-1]]), output_router_logits=True).router_logits
    for logits in routers:
        top = torch.topk(logits.double(), k + 1, dim=-1).values
        ties |= ((top[:, k - 1] - top[:, k]) < ROUTER_TIE_TOL).numpy()[len(prompt) - 1:]
    return ties


def assert_same_up_to_fp16_ties(hf, other_tokens, generator_out: Path, prompts=PROMPTS) -> None:
    """fp16 tokens of another session (og.Engine, or og.Generator with other settings) against og.Generator over
    the fp16 export ``generator_out``, teacher-forced on those tokens: at every step the token is within
    FP16_TIE_TOL + the Generator's fp16 error at that step of the Generator's best logit, except at routing ties
    (ROUTER_TIE_TOL), which leave at least half the steps held."""
    logits = genai(generator_out, "forced", prompts, forced=other_tokens)["logits"]
    for prompt, tokens, rows, ref in zip(prompts, other_tokens, logits,
                                         transformers_logits(hf, prompts, other_tokens)):
        rows = np.asarray(rows, np.float64)
        gap = rows.max(-1) - rows[np.arange(len(tokens)), tokens]
        allowed = FP16_TIE_TOL + np.abs(rows - ref).max(-1)
        held = ~routing_ties(hf, prompt, tokens)
        assert 2 * held.sum() >= len(tokens), (prompt, tokens, held)
        assert (gap[held] <= allowed[held]).all(), (prompt, tokens, gap, allowed, held)


def assert_same_tokens_across_sessions(hf, layout_id: str, out: Path, prompts, got, want) -> None:
    """Greedy fp16 tokens of two onnxruntime-genai sessions over ``out`` (with and without CUDA graphs): equal, but
    with routed experts (ROUTED_EXPERTS: each session times ORT's MoE tactics anew) each token of ``got`` within
    fp16 ties of the best logit at its step."""
    if layout_id in ROUTED_EXPERTS:
        assert_same_up_to_fp16_ties(hf, got, out, prompts)
    else:
        assert got == want


@pytest.fixture(scope="module", params=LAYOUTS, ids=[case[0] for case in LAYOUTS])
def layout(request, tmp_path_factory):
    """(checkpoint, transformers model, transformers' greedy tokens of PROMPTS, an EOS none of them holds)."""
    name, kind, options = request.param
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp(name) / "hf", kind, seed=7, **options)
    hf = load_reference(checkpoint)
    want = reference_tokens(hf, PROMPTS)
    return checkpoint, hf, want, unused_token(*PROMPTS, *want)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_generator_gives_transformers_tokens(layout, dtype, tmp_path):
    checkpoint, hf, want, eos = layout
    out = export_for_test(checkpoint, tmp_path / "out", eos, dtype=dtype)
    config = json.loads((out / "genai_config.json").read_text())
    # On CUDA, fp16 exports share their KV buffers and capture decode steps in CUDA graphs by default.
    graph = "1" if dtype == "fp16" else "0"
    assert config["model"]["decoder"]["session_options"]["provider_options"] == (
        [{"cuda": {"enable_cuda_graph": graph}}] if PROVIDER == "cuda" else [])
    if dtype == "fp32":
        assert genai(out, "generator", PROMPTS)["tokens"] == want
    else:
        assert_fp16_logits_close(hf, out, want)


def test_shared_kv_generator_with_cuda_graph(layout, request, tmp_path):
    """--kv-cache shared in fp16 (ORT's CUDA GroupQueryAttention; the -e cuda default): its logits are
    transformers' within FP16_REL_RMS_TOL, and on CUDA og.Generator with enable_cuda_graph (the default, which
    needs the shared buffers) picks the tokens it picks eagerly (up to fp16 ties with routed experts), one prompt at
    a time and as one batch, with the recurrent states updated in place (onnxruntime-genai's default) and
    double-buffered. The CPU dry run checks the export without the graph option."""
    checkpoint, hf, want, eos = layout
    layout_id = request.node.callspec.params["layout"][0]
    out = export_for_test(checkpoint, tmp_path / "out", eos, dtype="fp16", kv_cache="shared")
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is True
    assert_fp16_logits_close(hf, out, want)
    eager = genai(out, "generator", PROMPTS, cuda_graph=False if PROVIDER == "cuda" else None)["tokens"]
    assert [len(t) for t in eager] == [NEW_TOKENS] * len(PROMPTS)
    if PROVIDER == "cuda":
        def same_tokens(prompts, got, want):
            assert_same_tokens_across_sessions(hf, layout_id, out, prompts, got, want)

        same_tokens(PROMPTS, genai(out, "generator", PROMPTS, cuda_graph=True)["tokens"], eager)
        rows = [PROMPTS[0][i:i + 4] for i in range(0, 12, 4)]  # a batch of 3: og.Generator's decode at B > 1
        batch_eager = genai(out, "batch", rows, cuda_graph=False)["tokens"]
        same_tokens(rows, genai(out, "batch", rows, cuda_graph=True)["tokens"], batch_eager)
        double_buffered = {"ORTGENAI_SHARE_RECURRENT_STATE_UNDER_GRAPH_CAPTURE": "0"}
        same_tokens(rows, genai(out, "batch", rows, cuda_graph=True, environment=double_buffered)["tokens"],
                    batch_eager)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_engine_gives_transformers_tokens(layout, dtype, tmp_path):
    """The paged export in og.Engine, three requests at once: fp32 on the CPU gives transformers' tokens one for one;
    otherwise (an fp16 pool) the Engine's tokens are those of og.Generator over the plain export of the same
    precision up to fp16 ties, and that export's logits are transformers' within FP16_REL_RMS_TOL."""
    checkpoint, hf, want, eos = layout
    out = export_for_test(checkpoint, tmp_path / "out", eos, dtype=dtype, paged=True, block_size=BLOCK_SIZE)
    tokens = genai(out, "engine", PROMPTS)["tokens"]
    assert [len(t) for t in tokens] == [NEW_TOKENS] * len(PROMPTS)
    if exact(dtype, paged=True):
        assert tokens == want
        return
    plain = export_for_test(checkpoint, tmp_path / "plain", eos, dtype="fp16")
    assert_same_up_to_fp16_ties(hf, tokens, plain)
    assert_fp16_logits_close(hf, plain, want)


# Quantized exports (plain, -e cuda): id -> (export options, the LAYOUTS ids it runs on; None: every layout). The
# dense int8 products are the int4 ones' MatMulNBits with 8 bits; the MoE layouts add QMoE's.
QUANTIZED_LAYOUTS = {
    "int4": ({"weights": "int4"}, None),
    "int8": ({"weights": "int8"}, ROUTED_EXPERTS),
    "int4-asym-head-embedding": ({"weights": "int4", "weight_asymmetric": True, "quantize_lm_head": True,
                                  "quantize_embedding": True}, {"dense"}),
}


@pytest.mark.parametrize("case", list(QUANTIZED_LAYOUTS))
def test_quantized_weights_in_every_layout(layout, case, request, tmp_path):
    """int4 in every layout, int8 in the MoE ones, and int4 with zero points, the lm_head and the embedding
    (GatherBlockQuantized) in the dense one, as plain -e cuda exports (MatMulNBits; the routed experts as ORT's
    CUDA QMoE; Qwen3-Next's packed projections): og.Generator's logits, teacher-forced, are those of the
    fp16 export of the checkpoint with those weights rounded beforehand (the same weights in fp16: only the products'
    kernels differ), within FP16_REL_RMS_TOL plus twice the prompt's fp16_sensitivity (how far fp16 rounding alone
    carries it past a near-tie), and the tokens with CUDA graphs (the default) are those without
    (up to fp16 ties with routed experts).
    The CPU dry run takes fp32 at accuracy level 0 (fp32 sums), equal up to their order."""
    options, layouts = QUANTIZED_LAYOUTS[case]
    layout_id = request.node.callspec.params["layout"][0]
    if layouts is not None and layout_id not in layouts:
        pytest.skip(f"{case} runs on {', '.join(sorted(layouts))}")
    checkpoint = layout[0]
    precision = {"dtype": "fp16"} if PROVIDER == "cuda" else {"dtype": "fp32", "accuracy_level": 0}
    rounded = with_weights_rounded(checkpoint, tmp_path / "rounded", options, PROVIDER, precision.get("accuracy_level"),
                                   precision["dtype"])
    hf = load_reference(rounded)
    want = reference_tokens(hf, PROMPTS)
    eos = unused_token(*PROMPTS, *want)
    out = export_for_test(checkpoint, tmp_path / "out", eos, **options, **precision)
    same_weights = export_for_test(rounded, tmp_path / "same_weights", eos, dtype=precision["dtype"])
    got, ref = (genai(o, "forced", PROMPTS, forced=want)["logits"] for o in (out, same_weights))
    tolerances = ([FP16_REL_RMS_TOL + 2 * s for s in fp16_sensitivity(hf, PROMPTS, want)] if PROVIDER == "cuda"
                  else [1e-4] * len(PROMPTS))
    for prompt, ours, theirs, tolerance in zip(PROMPTS, got, ref, tolerances):
        rel = relative_rms(ours, np.asarray(theirs, np.float64))
        print(f"relative RMS {case} prompt of {len(prompt)}: {rel:.4f} (tolerance {tolerance:.3f})")  # -s / -rP
        assert rel <= tolerance, (prompt, rel, tolerance)
    tokens = genai(out, "generator", PROMPTS)["tokens"]
    assert [len(t) for t in tokens] == [NEW_TOKENS] * len(PROMPTS)
    if PROVIDER == "cuda":
        assert json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["session_options"][
            "provider_options"] == [{"cuda": {"enable_cuda_graph": "1"}}]
        assert_same_tokens_across_sessions(hf, layout_id, out, PROMPTS, tokens,
                                           genai(out, "generator", PROMPTS, cuda_graph=False)["tokens"])


# --- speculative decoding: lossless on the GPU --------------------------------------------------------------

def spec_prompts(*lengths):
    return [[(7 * i + 3 * b) % 150 + 1 for i in range(n)] for b, n in enumerate(lengths)]


# Short prompts, and prompts long enough (>= 32 tokens a request) for the chunked GatedDeltaNet prefill on the GPU.
SPEC_PROMPTS = {"short": spec_prompts(12, 4, 25, 1), "long": spec_prompts(40, 7, 70, 1)}
SPEC_TOKENS = 30
CAPACITY = 3
# The prompts tests/exporter/test_mtp_export.py fits its head on: with them its drafts end in full, partial and zero accepts.
MTP_PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8], [44, 3, 150, 12],
               [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 1], [77]]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """(checkpoint, {prompt set: transformers' tokens}, an EOS none of them holds)."""
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("spec") / "hf", "qwen3_5_text", seed=5)
    hf = load_reference(checkpoint)
    want = {name: reference_tokens(hf, prompts, SPEC_TOKENS) for name, prompts in SPEC_PROMPTS.items()}
    every = [seq for name, prompts in SPEC_PROMPTS.items() for seq in prompts + want[name]]
    return checkpoint, want, unused_token(*every)


def assert_partial_accepts(stats: dict) -> None:
    assert stats["partial_accept_rounds"] > 0 and stats["full_accept_rounds"] > 0, stats
    assert stats["target_forward_passes"] < SPEC_TOKENS, stats


@pytest.mark.parametrize("prompt_set", list(SPEC_PROMPTS))
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("op_domain", [contract.DOMAIN, contract.MS_DOMAIN], ids=["ours", "ort-own"])
def test_external_drafts_are_lossless(dense, dtype, op_domain, prompt_set, tmp_path):
    """(a) Partly wrong external drafts: the Engine commits partial accepts by replaying our capsules on the GPU
    and keeps the tokens of plain decoding bit for bit (fp16 too), which are transformers' (fp32). The same export
    on ORT's own GatedDeltaNet / conv kernels (--op-domain com.microsoft) is recorded, not required, since ORT's
    behaviour is not ours to promise: an earlier report had its drafted tokens leave plain decoding, the H100 runs
    of docs/lossless-speculative.md found them equal."""
    checkpoint, wants, eos = dense
    prompts, want = SPEC_PROMPTS[prompt_set], wants[prompt_set]
    out = export_for_test(checkpoint, tmp_path / "out", eos, dtype=dtype, paged=True, block_size=BLOCK_SIZE,
                          state_update_capacity=CAPACITY, op_domain=op_domain)
    plain = genai(out, "engine", prompts, SPEC_TOKENS)
    drafted = genai(out, "engine", prompts, SPEC_TOKENS, drafts_from=want)
    assert drafted["draft_width"] == CAPACITY
    if op_domain == contract.MS_DOMAIN and drafted["tokens"] != plain["tokens"]:
        first = [next((i for i, (a, b) in enumerate(zip(d, p)) if a != b), None)
                 for d, p in zip(drafted["tokens"], plain["tokens"])]
        pytest.xfail(f"ORT's own kernels: drafted tokens leave plain decoding at generated token {first} per request "
                     f"(plain equals transformers: {plain['tokens'] == want}; stats {drafted['stats']})")
    assert drafted["tokens"] == plain["tokens"]
    if exact(dtype, paged=True):
        assert plain["tokens"] == want
    assert_partial_accepts(drafted["stats"])


# Quantized exports: int4 (on CUDA QuantizedLinear where drafts are verified; the lm_head and b/a gates in fp16), int8
# (MatMulNBits), and int4 with every product QuantizedLinear (docs/lossless-speculative.md, "QuantizedLinear on the
# GPU").
QUANTIZED = {"int4": {"weights": "int4"}, "int8": {"weights": "int8"},
             "int4-every-product": {"weights": "int4", "quantize_lm_head": True, "quantize_gates": True}}


@pytest.mark.parametrize("case", list(QUANTIZED))
def test_quantized_weights_generate_and_speculate_losslessly(dense, case, tmp_path):
    """Quantized weights on the GPU: the plain export generates the same tokens with CUDA graphs (its default on
    CUDA) as without, and the paged export with capacity 3 keeps plain decoding's tokens under partly wrong external
    drafts, through full and partial accepts (a verify call's rows must come out as one-token steps do:
    tests/cuda/test_cuda_ep.py checks MatMulNBits itself, tests/cuda/test_cuda_quantized_linear.py
    QuantizedLinear). Only the export with every product QuantizedLinear must hold on CUDA."""
    checkpoint, _, eos = dense
    prompts = SPEC_PROMPTS["long"]
    options = QUANTIZED[case]
    plain_export = export_for_test(checkpoint, tmp_path / "plain", eos, **options)
    out = export_for_test(checkpoint, tmp_path / "paged", eos, **options, paged=True, block_size=BLOCK_SIZE,
                          state_update_capacity=CAPACITY)
    for candidate in range(VOCAB - 1, 0, -1):  # an EOS the quantized model never picks: every run is full length
        set_eos(out, candidate)
        plain = genai(out, "engine", prompts, SPEC_TOKENS)
        if all(len(t) == SPEC_TOKENS for t in plain["tokens"]):
            break
    set_eos(plain_export, candidate)
    tokens = genai(plain_export, "generator", prompts, SPEC_TOKENS)["tokens"]
    assert [len(t) for t in tokens] == [SPEC_TOKENS] * len(prompts)
    if PROVIDER == "cuda":
        assert genai(plain_export, "generator", prompts, SPEC_TOKENS, cuda_graph=False)["tokens"] == tokens
    # Drafts from plain decoding's own tokens, one wrong on every other round (transformers' fp32 tokens may part
    # from the quantized model's early, which would leave no partial accepts to check).
    drafted = genai(out, "engine", prompts, SPEC_TOKENS, drafts_from=plain["tokens"])
    assert_partial_accepts(drafted["stats"])
    if PROVIDER == "cuda" and case != "int4-every-product" and drafted["tokens"] != plain["tokens"]:
        first = min((i for got, ref in zip(drafted["tokens"], plain["tokens"])
                     for i, (a, b) in enumerate(zip(got, ref)) if a != b), default="(a length)")
        reason = ("ORT's CUDA MatMulNBits is not row-invariant (tests/cuda/test_cuda_ep.py)" if case == "int8" else
                  "the lm_head and the b/a gates left in fp16 run on ORT's CUDA Gemm, not known to be row-invariant")
        pytest.xfail(f"{reason}: drafted tokens leave plain decoding at generated token {first}")
    assert drafted["tokens"] == plain["tokens"]


def test_zeroed_capsules_diverge(dense, tmp_path):
    """Negative control: the same export with its GDN capsules zeroed loads and drafts, but every partial accept
    rebuilds a zero recurrent state, so the tokens leave the reference."""
    checkpoint, wants, eos = dense
    want = wants["short"]
    out = export_for_test(checkpoint, tmp_path / "out", eos, dtype="fp32", paged=True, block_size=BLOCK_SIZE,
                          state_update_capacity=CAPACITY)
    run = genai(tamper_capsules(out, tmp_path / "tampered"), "engine", SPEC_PROMPTS["short"], SPEC_TOKENS,
                drafts_from=want)
    assert run["stats"]["partial_accept_rounds"] > 0
    assert all(got != ref for got, ref in zip(run["tokens"], want)), run["tokens"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_mtp_head_drafts_are_lossless(dtype, tmp_path):
    """(b) The exported MTP head drafts (a head fitted to the model, so it is often right), four requests at once:
    the tokens equal plain decoding of the same export (no head) bit for bit, and transformers' (exact() says how
    closely)."""
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "qwen3_5_multimodal", tied=True, seed=3, mtp=True)
    runs = greedy_runs(export(hf_dir, tmp_path / "fit", progress=False), MTP_PROMPTS, SPEC_TOKENS, contract.DOMAIN)
    fit = [(tokens[:len(p) + 16], hidden[:len(p) + 16]) for (tokens, hidden), p in zip(runs, MTP_PROMPTS)]
    add_mtp_head(hf_dir, fit_drafting_head(hf_dir, fit))
    want = reference_tokens(load_reference(hf_dir), MTP_PROMPTS, SPEC_TOKENS)
    eos = unused_token(*MTP_PROMPTS, *want)
    out = export_for_test(hf_dir, tmp_path / "out", eos, dtype=dtype, paged=True, block_size=BLOCK_SIZE,
                          state_update_capacity=CAPACITY, max_draft_tokens=CAPACITY)
    assert (out / "mtp.onnx").is_file()
    drafted = genai(out, "engine", MTP_PROMPTS, SPEC_TOKENS)
    stats = drafted["stats"]
    assert stats["draft_forward_passes"] > 0 and stats["mtp_failures"] == 0, stats
    assert_partial_accepts(stats)
    no_head = export_for_test(hf_dir, tmp_path / "plain", eos, dtype=dtype, paged=True, block_size=BLOCK_SIZE,
                              state_update_capacity=CAPACITY, mtp=False)
    assert drafted["tokens"] == genai(no_head, "engine", MTP_PROMPTS, SPEC_TOKENS)["tokens"]
    if exact(dtype, paged=True):
        assert drafted["tokens"] == want
