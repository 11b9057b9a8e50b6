"""``export()``: a Hugging Face hybrid checkpoint folder in, an onnxruntime-genai model folder out."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
from tqdm.auto import tqdm

from ..configs.genai_config import DecoderExport, DecoderIO, genai_config
from ..configs.state_groups import FORMS, RELEASED
from ..ops import contract
from . import io_names as io
from .checkpoint import Checkpoint
from .errors import ExportError
from .graph.context import GraphContext
from .graph.decoder import GraphOptions, assemble_model, build_decoder
from .graph.group_query_attention import CONCAT, KV_CACHES, SHARED
from .graph.paged_attention import KERNELS as PAGED_ATTENTION_KERNELS, PagedLayout
from .graph.quantized import cpu_int8_products, qmoe_refuses, quant_options, verify_not_lossless
from .kv_pool import paged_cache, pool_num_blocks
from .model_config import ModelConfig, load_model_config
from .mtp import check_mtp_weights, mtp_config, mtp_tensor_count, write_mtp_head
from .output_dir import check_target, staged_output
from .weights import Weights, write_external_data

log = logging.getLogger("onnx_hybrid.exporter")

DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": "bfloat16"}
OP_DOMAINS = (contract.DOMAIN, contract.MS_DOMAIN)
# --execution-provider: where onnxruntime-genai runs the export, and the activation type it gets by default.
EXECUTION_PROVIDERS = {"cpu": "fp32", "cuda": "fp16"}
MODEL_FILE, DATA_FILE, GENAI_CONFIG = "model.onnx", "model.onnx.data", "genai_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")
TOKENIZER_NEEDED = ("tokenizer.json", "tokenizer_config.json")  # what og.Tokenizer reads
# genai model.type per family. 0.18 has no qwen3_next type; the decoder I/O is that of qwen3_5_moe_text,
# and genai feeds these types the 2-D position_ids the graph declares (tests/exporter/test_export_e2e.py).
GENAI_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "qwen3_next": "qwen3_5_moe_text"}


def numpy_dtype(dtype: str) -> np.dtype:
    if dtype not in DTYPES:
        raise ExportError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(DTYPES[dtype])


def export(model_dir, out_dir, *, dtype: str | None = None, state_update_capacity: int = 0,
           op_domain: str = contract.DOMAIN, overwrite: bool = False, all_logits: bool = False,
           progress: bool = True, manifest_format: str = RELEASED, paged: bool = False,
           block_size: int = 256, num_blocks: int | None = None, paged_attention: str | None = None,
           mtp: bool = True, logits_dtype: str | None = None, max_draft_tokens: int | None = None,
           execution_provider: str = "cpu", cuda_archs=None, weights: str | None = None, weight_block: int = 32,
           weight_asymmetric: bool = False, accuracy_level: int | None = None, quantize_lm_head: bool = False,
           quantize_embedding: bool = False, quantize_gates: bool = False, kv_cache: str | None = None,
           cuda_graph: bool | None = None, linear_op: bool | None = None) -> Path:
    """Export ``model_dir`` to ``out_dir`` (model.onnx + external data, genai_config.json, tokenizer).

    ``execution_provider`` (``cpu`` or ``cuda``) is written into the session options of the decoder and the
    MTP head, so onnxruntime-genai runs the export there. ``dtype`` defaults to fp32 for ``cpu`` and fp16 for
    ``cuda``. A ``cuda`` export with our ops carries the CUDA kernel images for ``cuda_archs`` (default
    ``library.DEFAULT_CUDA_ARCHS``) in ``onnx_hybrid_cuda/`` beside its copy of the library, where the library
    finds them by itself; its paged graph uses ONNX Runtime's CUDA PagedAttention.

    ``all_logits`` keeps logits for every position ([B, S, V]); by default only each row's last
    position is computed ([B, 1, V]), which is all greedy decoding and onnxruntime-genai need.
    ``manifest_format`` picks the state_groups form of genai_config.json: ``released`` (what
    onnxruntime-genai 0.18 parses) or ``bindings`` (PR #2454).

    ``paged`` exports what onnxruntime-genai's Engine (dynamic batching) runs: requests packed on one
    token axis, full attention as PagedAttention over a pool of ``block_size``-token blocks, logits for
    every token, and ``engine.dynamic_batching`` in genai_config.json (``num_blocks`` pins the pool size;
    default: kv_pool.py). ``paged_attention`` picks the attention kernel's domain: ``onnx_hybrid`` (our
    CPU kernel, any dtype; the default with ``op_domain`` onnx_hybrid) or ``com.microsoft`` (ORT's CUDA
    kernel, fp16/bf16 pool; the default with ``op_domain`` com.microsoft).

    When the checkpoint has MTP weights (``mtp.*``) and ``mtp`` is set, the MTP drafter is written too:
    ``mtp.onnx`` (non-paged or paged like the main model), the decoder's post-norm ``hidden_states``
    output, ``model.mtp`` and ``speculative.max_draft_tokens`` (default: the state-update capacity when
    paged, else 1) in genai_config.json. A non-paged MTP export keeps logits for every position (the
    drafts are verified). ``logits_dtype`` casts the main logits (fp16 works around onnxruntime-genai
    0.18's MtpGenerator on CPU, which fails on fp32 logits: docs/genai-config.md#runtime-pitfalls-the-export-avoids).

    ``weights`` ``int4`` or ``int8`` block-quantizes every linear projection (MatMulNBits) and the routed
    experts (QMoE, where the provider's takes them: graph/quantized.py's qmoe_refuses), streamed per tensor: blocks
    of ``weight_block`` along the input axis, symmetric unless ``weight_asymmetric``; ``accuracy_level`` is
    MatMulNBits' (default 4 on CPU, 0 on CUDA). The lm_head and the embedding (GatherBlockQuantized) keep the
    activation type unless ``quantize_lm_head`` / ``quantize_embedding``, and so do the GatedDeltaNet's b and a
    gate projections unless ``quantize_gates``.
    See graph/quantized.py for what stays unquantized and why.

    ``kv_cache`` (non-paged exports): ``concat`` grows each full-attention layer's KV by a Concat per step;
    ``shared`` runs it as GroupQueryAttention over past/present buffers onnxruntime-genai shares in place
    (``search.past_present_share_buffer: true``), which its CUDA graph capture requires (the MTP head too).
    Default: ``shared`` for a non-paged export, but ``concat`` for fp32 on CUDA (ORT's CUDA GroupQueryAttention
    has no fp32 kernel).

    ``cuda_graph`` writes the CUDA provider's ``enable_cuda_graph``, so onnxruntime-genai captures decode steps
    in CUDA graphs and replays them. Default: on for a CUDA export with shared KV buffers and no MTP head (the
    head's verify steps change shape from step to step, which a captured graph cannot follow).

    ``linear_op`` writes the projections kept in the activation type as ``onnx_hybrid::Linear`` instead of
    ``Gemm(transB=1)``: the same product, whose CUDA kernel reads the weights of a one-row step (decode at batch 1)
    at the copy rate and hands larger ones to cuBLAS as ORT's Gemm does. Default: on for a fp16/bf16 CUDA export
    that uses the library and verifies no drafts (no MTP head, no state-update capacity): the one-row kernel and
    cuBLAS round a row differently, so a verify row would not be the decode step it stands for
    (docs/op-contract.md#linear). 4-bit projections are ``onnx_hybrid::QuantizedLinear`` instead of MatMulNBits by
    default in a CPU export with our ops at accuracy level 4 (the CPU default) and blocks of a multiple of 32: its
    CPU kernel multiplies int8 input rows by codes repacked once, faster than MatMulNBits at one row and at a
    prompt's rows, and a row's bits never depend on the rows beside it (docs/benchmarks-quantized-cpu.md); and
    where a fp16/bf16 CUDA export verifies drafts (a row's bits do not depend on the rows beside it, up to 64
    a step, so verify rows are the decode steps they stand for) or is paged (og.Engine batches requests: at 16 rows
    QuantizedLinear reads the weights once on tensor cores, where ORT's CUDA MatMulNBits dequantizes them for a
    GEMM; a 9B decode step at batch 16 was 2.36x as fast); elsewhere MatMulNBits stays, whose one-row kernel is the
    faster at batch 1 (docs/benchmarks.md#quantizedlinear-against-matmulnbits). Given explicitly, ``linear_op``
    decides for both.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if execution_provider not in EXECUTION_PROVIDERS:
        raise ExportError(f"execution_provider must be one of {', '.join(EXECUTION_PROVIDERS)}, "
                          f"got {execution_provider!r}")
    on_cuda = execution_provider == "cuda"
    if cuda_archs is not None and not on_cuda:
        raise ExportError("cuda_archs (--cuda-arch) applies to CUDA exports only: add execution_provider='cuda' "
                          "(-e cuda)")
    dtype = dtype or EXECUTION_PROVIDERS[execution_provider]
    np_act = numpy_dtype(dtype)
    quant = quant_options(weights, dtype, block_size=weight_block, asymmetric=weight_asymmetric,
                          accuracy_level=accuracy_level, lm_head=quantize_lm_head, embedding=quantize_embedding,
                          gates=quantize_gates, execution_provider=execution_provider)
    if not 0 <= state_update_capacity <= contract.MAX_STATE_UPDATE_CAPACITY:
        raise ExportError(f"state_update_capacity must be in [0, {contract.MAX_STATE_UPDATE_CAPACITY}], "
                          f"got {state_update_capacity}")
    if paged and (block_size < 16 or block_size & (block_size - 1)):
        raise ExportError(f"block_size must be a power of two >= 16, got {block_size}")
    if paged and num_blocks is not None and num_blocks <= 0:
        raise ExportError(f"num_blocks must be positive, got {num_blocks}")
    if manifest_format not in FORMS:
        raise ExportError(f"manifest_format must be one of {', '.join(FORMS)}, got {manifest_format!r}")
    if op_domain not in OP_DOMAINS:
        raise ExportError(f"op_domain must be one of {', '.join(OP_DOMAINS)}, got {op_domain!r}")
    # ORT has PagedAttention only on CUDA; our library's kernel is for the CPU.
    paged_attention = paged_attention or (contract.MS_DOMAIN if on_cuda else op_domain)
    if paged_attention not in PAGED_ATTENTION_KERNELS:
        raise ExportError(f"paged_attention must be one of {', '.join(PAGED_ATTENTION_KERNELS)}, "
                          f"got {paged_attention!r}")
    if max_draft_tokens is not None and max_draft_tokens < 1:
        raise ExportError(f"max_draft_tokens must be positive, got {max_draft_tokens}")
    if kv_cache is None:  # ORT's CUDA GroupQueryAttention has no fp32 kernel
        kv_cache = CONCAT if paged or (on_cuda and np_act == np.float32) else SHARED
    if kv_cache not in KV_CACHES:
        raise ExportError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
    if paged and kv_cache == SHARED:
        raise ExportError("kv_cache='shared' (--kv-cache shared) is for non-paged exports: a paged export's block "
                          "pool is already shared in place")
    if kv_cache == SHARED and on_cuda and np_act == np.float32:
        raise ExportError("kv_cache='shared' on CUDA needs --dtype fp16 or bf16: ONNX Runtime's CUDA "
                          "GroupQueryAttention has no fp32 kernel")
    if cuda_graph and not (on_cuda and kv_cache == SHARED and not paged):
        raise ExportError("cuda_graph (CUDA graph capture) needs execution_provider='cuda' (-e cuda) and the shared "
                          "KV buffers of a non-paged export (kv_cache='shared'): onnxruntime-genai refuses to capture "
                          "otherwise")
    check_target(out_dir, overwrite, protect=(model_dir,))  # before any work; staged_output checks again
    cfg = load_model_config(model_dir)
    checkpoint = Checkpoint(model_dir)
    for what, count in checkpoint.skipped.items():
        log.warning("skipping %d tensor(s) of the %s (not part of the text decoder)", count, what)
    missing = [name for name in TOKENIZER_NEEDED if not (model_dir / name).is_file()]
    if missing:
        log.warning("%s has no %s: onnxruntime-genai's og.Tokenizer will fail on the export; copy the "
                    "tokenizer files of the released model into the output folder", model_dir, " or ".join(missing))
    if quant and any(cfg.moe_layers) and (why := qmoe_refuses(quant, cfg.hidden_size)):
        log.warning("the routed experts stay in %s: %s", dtype, why)
    mtp_tensors = mtp_tensor_count(checkpoint)
    with_mtp = mtp and mtp_tensors > 0
    if with_mtp:
        check_mtp_weights(checkpoint, cfg.mtp_num_hidden_layers)
    elif mtp_tensors:
        log.warning("skipping %d tensor(s) of the multi-token-prediction head (no MTP export requested)",
                    mtp_tensors)
    verifies = bool(state_update_capacity or with_mtp)
    own_products = on_cuda and np_act != np.float32 and op_domain == contract.DOMAIN
    cpu_int8 = not on_cuda and op_domain == contract.DOMAIN and cpu_int8_products(quant)
    # By default each op where it is the better choice: 4-bit projections as QuantizedLinear on the CPU where it
    # multiplies int8 rows (faster than MatMulNBits at one row and at many), on CUDA where drafts are verified (its
    # rows do not depend on the rows beside them) or requests are batched (paged: its tensor-core product reads the
    # weights once for all rows), else MatMulNBits (faster at one row on CUDA); projections in the activation type
    # as Linear only where none are verified (its one row and several round differently).
    quantized_linear_op = cpu_int8 or (own_products and (verifies or paged)) if linear_op is None else linear_op
    if linear_op is None:
        linear_op = own_products and not verifies
    if (quantized_linear_op and not on_cuda and quant and quant.spec.bits == contract.QUANTIZED_LINEAR_BITS
            and not cpu_int8_products(quant)):
        log.warning("QuantizedLinear (--linear-op) on the CPU dequantizes its weights on every call below "
                    "--accuracy-level 4: ONNX Runtime's MatMulNBits, which a CPU export then writes without "
                    "--linear-op, was 1.5x as fast at 128 rows and 19x at one row "
                    "(docs/benchmarks.md#quantizedlinear-against-matmulnbits)")
    if verifies and (why := verify_not_lossless(quant, execution_provider, linear_op, quantized_linear_op,
                                                routed_experts=any(cfg.moe_layers))):
        log.warning("speculative decoding with this export may leave plain decoding's tokens: %s "
                    "(docs/lossless-speculative.md)", why)
    logits_type = ir.DataType.from_numpy(numpy_dtype(logits_dtype)) if logits_dtype else None
    uses_library = (op_domain == contract.DOMAIN or (paged and paged_attention == contract.DOMAIN) or linear_op
                    or (quant is not None and quantized_linear_op))
    library = _op_library() if uses_library else None  # an unbuilt library fails now, not after the weights
    library_name = library.name if library else None
    archs = _cuda_archs(cuda_archs) if on_cuda and library else ()

    ctx = GraphContext(config=cfg, weights=Weights(checkpoint), act=ir.DataType.from_numpy(np_act),
                       np_act=np_act, op_domain=op_domain, capacity=state_update_capacity, quant=quant,
                       kv_cache=kv_cache, linear_op=linear_op, quantized_linear_op=quantized_linear_op,
                       gated_norm_op=on_cuda)
    layout = PagedLayout(block_size, paged_attention) if paged else None
    num_blocks = pool_num_blocks(num_blocks, cfg, block_size=block_size, kernel=paged_attention,
                                 itemsize=np_act.itemsize, head_layers=int(with_mtp)) if paged else num_blocks
    options = GraphOptions(last_token_logits=not (all_logits or with_mtp), paged=layout, hidden_states=with_mtp,
                           logits_dtype=logits_type)
    inputs, outputs = build_decoder(ctx, options)

    with staged_output(out_dir, overwrite, protect=(model_dir,)) as stage:
        with tqdm(total=len(ctx.weights.plans), unit="tensor", desc="writing weights", disable=not progress) as bar:
            write_external_data(ctx.weights, stage / DATA_FILE, lambda plan: bar.update())
        ir.save(assemble_model(ctx, inputs, outputs), stage / MODEL_FILE)
        if with_mtp:
            write_mtp_head(ctx, layout, stage)
        if library:
            shutil.copy2(library, stage / library.name)
        if archs:
            from ..ops.library import IMAGE_FOLDER, write_cuda_images

            # Copied from beside the library where a wheel ships them, else compiled (about a minute an arch, then
            # cached): a bar, so the compile is not a silent pause.
            for arch in tqdm(archs, desc="CUDA kernel images", unit="arch", disable=not progress):
                write_cuda_images([arch], stage / IMAGE_FOLDER)
        desc = dataclasses.replace(decoder_export(cfg, state_update_capacity, library_name, paged=paged),
                                   manifest_format=manifest_format, execution_provider=execution_provider,
                                   paged=paged_cache(block_size, num_blocks) if paged else None,
                                   share_kv_buffers=kv_cache == SHARED,
                                   cuda_graph=cuda_graph if cuda_graph is not None else (
                                       on_cuda and kv_cache == SHARED and not with_mtp))
        config = genai_config(desc)
        if with_mtp:
            draft_default = state_update_capacity if paged and state_update_capacity else 1
            mtp_config(config, paged=paged, max_draft_tokens=max_draft_tokens or draft_default)
        (stage / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n")
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copy2(model_dir / name, stage / name)
    return out_dir


def decoder_export(cfg: ModelConfig, capacity: int, custom_ops_library: str | None, *,
                   paged: bool = False) -> DecoderExport:
    if paged:  # packed-batch metadata instead of attention_mask (docs/genai-config.md#graph-inputs-and-outputs)
        inputs = {"input_ids": io.INPUT_IDS, "position_ids": io.POSITION_IDS, "block_table": io.BLOCK_TABLE,
                  "cumulative_sequence_lengths": io.CUMULATIVE_SEQUENCE_LENGTHS,
                  "past_sequence_lengths": io.PAST_SEQUENCE_LENGTHS, "attention_metadata": io.ATTENTION_METADATA}
    else:
        inputs = {"input_ids": io.INPUT_IDS, "attention_mask": io.ATTENTION_MASK, "position_ids": io.POSITION_IDS}
    inputs.update(past_key_names=io.PAST_KEY, past_value_names=io.PAST_VALUE,
                  past_conv_names=io.PAST_CONV, past_recurrent_names=io.PAST_RECURRENT)
    outputs = {"logits": io.LOGITS, "present_key_names": io.PRESENT_KEY, "present_value_names": io.PRESENT_VALUE,
               "present_conv_names": io.PRESENT_CONV, "present_recurrent_names": io.PRESENT_RECURRENT}
    if capacity:
        inputs.update(state_update_capture_count=io.STATE_UPDATE_CAPTURE_COUNT,
                      state_update_active=io.STATE_UPDATE_ACTIVE)
        outputs.update(state_update_conv_value_names=io.STATE_UPDATE_CONV_VALUE,
                       state_update_recurrent_capsule_names=io.STATE_UPDATE_RECURRENT_CAPSULE)
    return DecoderExport(
        model_type=GENAI_MODEL_TYPES[cfg.family], filename=MODEL_FILE, vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_size=cfg.head_dim, context_length=cfg.max_position_embeddings,
        io=DecoderIO(inputs, outputs), linear_layer_ids=tuple(cfg.linear_layers),
        gdn_key_heads=cfg.gdn_key_heads, state_update_capacity=capacity, bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, custom_ops_library=custom_ops_library)


def _cuda_archs(requested) -> tuple[int, ...]:
    """The architectures whose kernel images a CUDA export carries: compute capabilities such as 80 or 90."""
    from ..ops.library import DEFAULT_CUDA_ARCHS

    archs = tuple(sorted(set(requested))) if requested is not None else DEFAULT_CUDA_ARCHS
    bad = [a for a in archs if not isinstance(a, int) or not 50 <= a <= 999]
    if bad or not archs:
        raise ExportError(f"cuda_archs must be compute capabilities without the dot (80 for A100, 89 for L4/L40, 90 "
                          f"for H100/H200), got {list(requested)}")
    return archs


def _op_library() -> Path:
    """Our kernel library, copied next to the model; genai_config names it by bare file name
    (docs/genai-config.md#custom-op-library)."""
    from ..ops import library

    return Path(library.library_path())

