"""scripts/paged_greedy.py on CPU, with our PagedAttention kernel (the GPU run swaps in ORT's com.microsoft
kernel: STEPS=paged bash scripts/gpu_session.sh): the packed paged driver picks the same greedy tokens as the
non-paged export and as transformers, in fp32 and fp16, for two requests of different lengths that share a
pool through an interleaved block table."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import load_reference, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.packed import interleaved_block_table  # noqa: E402
from file_modules import load_file  # noqa: E402

NEW_TOKENS = 10
# Seed 1 decodes varied tokens for both default prompts (seed 0 repeats one token for the long prompt).
SEED = 1




paged_greedy = load_file("scripts/paged_greedy.py", "paged_greedy")
PROMPTS = paged_greedy.DEFAULT_PROMPTS


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("paged_driver")
    checkpoint = make_tiny_checkpoint(root / "checkpoint", seed=SEED)
    out = {"checkpoint": checkpoint}
    for dtype in ("fp32", "fp16"):
        out["paged", dtype] = export(checkpoint, root / f"paged_{dtype}", dtype=dtype, paged=True, block_size=16,
                                     paged_attention=contract.DOMAIN, progress=False)
        out["nonpaged", dtype] = export(checkpoint, root / f"nonpaged_{dtype}", dtype=dtype, progress=False)
    return out


@pytest.fixture(scope="module")
def transformers_tokens(exports):
    hf = load_reference(exports["checkpoint"])
    tokens = []
    for prompt in PROMPTS:
        sequence = list(prompt)
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                sequence.append(int(hf(torch.tensor([sequence])).logits[0, -1].argmax()))
        tokens.append(sequence[len(prompt):])
    return tokens


def test_interleaved_block_table_uses_every_block_once_and_no_identity_mapping():
    table, num_blocks = interleaved_block_table([40, 5, 17], block_size=16)
    assert num_blocks == 3 + 1 + 2
    assert table.tolist() == [[5, 2, 0], [4, 0, 0], [3, 1, 0]]  # [1, 2] and [2, 1] entries unused
    used = [table[0, 0], table[0, 1], table[0, 2], table[1, 0], table[2, 0], table[2, 1]]
    assert sorted(used) == list(range(num_blocks))


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_paged_driver_matches_nonpaged_export_and_transformers(dtype, exports, transformers_tokens):
    report = paged_greedy.compare(exports["paged", dtype], exports["nonpaged", dtype], exports["nonpaged", "fp32"],
                                  PROMPTS, NEW_TOKENS, "cpu")
    assert report["paged_tokens"] == report["nonpaged_tokens"] == transformers_tokens
    assert len({len(t) for t in transformers_tokens}) == 1 and len(set(transformers_tokens[0])) > 3  # not degenerate
    # fp32: both exports run the same fp32 ops, only the attention kernel's summation order differs (measured
    # 3.8e-6 on logits of magnitude 15). fp16: the whole model's fp16 rounding, paged or not, with the norm scales
    # in fp16 as ORT's fused norm kernels take them (measured 3.3e-2 on logits of magnitude 15, i.e. 2.2e-3 of the
    # largest |logit|; 1.1e-3 while the scales were fp32 and each norm a Cast, a norm and a Cast).
    scale = report["logits_scale"]
    tolerance = 1e-5 * scale if dtype == "fp32" else 3e-3 * scale
    assert report["paged_vs_fp32"] < tolerance, report
    assert report["nonpaged_vs_fp32"] < tolerance, report


def test_script_main_prints_tokens_and_passes_compare(exports, capsys):
    assert paged_greedy.main([str(exports["paged", "fp32"]), "--new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("block table [[")
    assert lines[1].startswith("request 0 (18 prompt tokens): [") and lines[2].startswith("request 1 (5 prompt")
    status = paged_greedy.main([str(exports["paged", "fp16"]), "--new-tokens", "3", "--compare",
                                str(exports["nonpaged", "fp16"]), "--reference", str(exports["nonpaged", "fp32"])])
    assert status == 0 and capsys.readouterr().out.splitlines()[-1] == "PASS (cpu; tolerance 0.02)"
