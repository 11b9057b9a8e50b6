"""Quantized weights in the graph: which weights an export quantizes, and the ONNX Runtime contrib ops that
read them (``com.microsoft::MatMulNBits``, ``QMoE``, ``GatherBlockQuantized``; CPU and CUDA kernels in ORT).

Projections become MatMulNBits; the routed experts one QMoE; the embedding, when asked, GatherBlockQuantized.
The router and the shared expert's gate (a few rows that decide discrete routing), norms, the conv taps,
``A_log``/``dt_bias`` and the recurrent state keep their types, and so do the GatedDeltaNet's b and a gate
projections unless asked (``gates``): 2 x Hv rows a layer (0.12% of a 9B layer's weights) whose outputs set every
step's decay and write strength. Quantized, they moved the tiny checkpoint's int8 logits 5% further from fp32
(docs/benchmarks-quantized-cpu.md#accuracy); onnxruntime-genai's builder keeps them unquantized too.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ...ops import contract
from ..errors import ExportError
from ..quantize import BLOCK_SIZES, QuantSpec
from ..weights import QuantizedWeight


@dataclass(frozen=True)
class QuantOptions:
    spec: QuantSpec
    # MatMulNBits / QMoE accuracy_level: 4 lets the CPU kernels quantize activations to int8, which also makes
    # a row's result independent of how many rows the call has at some block sizes (CPU_ROW_INVARIANT).
    accuracy_level: int = 0
    lm_head: bool = False
    embedding: bool = False
    gates: bool = False  # the GatedDeltaNet b and a projections
    execution_provider: str = "cpu"


def matmul_nbits(ctx, x: ir.Value, weight: QuantizedWeight, accuracy_level: int) -> ir.Value:
    """x [T, K] @ W^T for W [N, K] stored as MatMulNBits B [N, k_blocks, blob]."""
    n, k = weight.shape
    return ctx.tape.op("MatMulNBits", _present([x, weight.codes, weight.scales, weight.zero_points]),
                       {"K": k, "N": n, "bits": weight.spec.bits, "block_size": weight.spec.block_size,
                        "accuracy_level": accuracy_level}, domain=contract.MS_DOMAIN)


def gather_block_quantized(ctx, table: QuantizedWeight, indices: ir.Value) -> ir.Value:
    """Rows ``indices`` of the [V, H] table, dequantized to the scales' type."""
    return ctx.tape.op("GatherBlockQuantized", _present([table.codes, indices, table.scales, table.zero_points]),
                       {"bits": table.spec.bits, "block_size": table.spec.block_size, "gather_axis": 0,
                        "quantize_axis": 1}, domain=contract.MS_DOMAIN)


# ONNX Runtime's CUDA QMoE reads int4/int8 experts through CUTLASS tiles of 64 along each product's reduction axis
# (the hidden size for gate/up, the expert size for down) and refuses other sizes: the exporter pads the expert size.
QMOE_K_TILE = 64


def qmoe_refuses(quant: QuantOptions, hidden_size: int) -> str | None:
    """Why the execution provider's QMoE cannot take routed experts of ``hidden_size`` quantized per ``quant``
    (None: it can); such experts stay in the activation type (ORT's MoE)."""
    if quant.execution_provider != "cuda":
        return None
    if hidden_size % QMOE_K_TILE:
        return f"ONNX Runtime's CUDA QMoE needs a hidden size that is a multiple of {QMOE_K_TILE}, got {hidden_size}"
    if not experts_block_wise(hidden_size, quant) and not quant.spec.symmetric:
        return (f"the hidden size {hidden_size} is not a multiple of the weight block {quant.spec.block_size}, and "
                f"ONNX Runtime's CUDA QMoE has no zero points with one scale per expert row")
    return None


def quantizes_experts(quant: QuantOptions | None, hidden_size: int) -> bool:
    return quant is not None and qmoe_refuses(quant, hidden_size) is None


def qmoe(ctx, x: ir.Value, router_logits: ir.Value, gate_up: QuantizedWeight, down: QuantizedWeight,
         attributes: dict, accuracy_level: int) -> ir.Value:
    """The routed experts as one QMoE: ``attributes`` are those of the float MoE node it replaces; without
    block_size (the ``columns`` form) each expert row has one scale."""
    spec = gate_up.spec
    block = {"block_size": spec.block_size} if gate_up.form == "experts" else {}
    mixing = None
    if not attributes["normalize_routing_weights"]:
        # ORT 1.32's CPU QMoE renormalises the top-k whatever this attribute says; mixing weights given as
        # router_weights are used as they are: the softmax over all experts, HF's routing without norm_topk_prob.
        logits = router_logits if ctx.act == ir.DataType.FLOAT else ctx.op("Cast", router_logits, to=ir.DataType.FLOAT)
        mixing = ctx.op("Softmax", logits, axis=-1)
        mixing = mixing if ctx.act == ir.DataType.FLOAT else ctx.op("Cast", mixing, to=ctx.act)
    inputs = [x, router_logits, gate_up.codes, gate_up.scales, None, down.codes, down.scales, None, None, None, None,
              gate_up.zero_points, down.zero_points, None, mixing]
    # weights_prepacked 0: the codes are in the raw [E, N, K * bits / 8] layout, which ORT's CUDA QMoE turns into
    # CUTLASS's own when the session loads; its default (-1) takes them as already turned and sums garbage, silently.
    return ctx.tape.op("QMoE", _present(inputs), {**attributes, "expert_weight_bits": spec.bits, "weights_prepacked": 0,
                                        "accuracy_level": accuracy_level, **block}, domain=contract.MS_DOMAIN)


def experts_block_wise(hidden_size: int, quant: QuantOptions) -> bool:
    """Whether the routed experts take QMoE's block-wise form, else one scale per expert row. Block-wise needs a
    whole number of blocks along the hidden size (the expert size is padded). ONNX Runtime 1.32's CPU QMoE
    computes block-wise int8 experts with int8 activations (blocks of the weights' size, max / 127), whatever
    accuracy_level says: that is what accuracy_level 4 asks for, so below it int8 experts on the CPU are row-wise,
    which it computes in fp32."""
    if hidden_size % quant.spec.block_size:
        return False
    return not (quant.execution_provider == "cpu" and quant.spec.bits == 8 and quant.accuracy_level < 4)


def _present(inputs: list) -> list:
    """``inputs`` without trailing omitted optionals (an empty name is an omitted input only mid-list)."""
    while inputs[-1] is None:
        inputs = inputs[:-1]
    return inputs


WEIGHT_TYPES = {"int4": 4, "int8": 8}
# MatMulNBits accuracy_level per execution provider when not given: onnxruntime-genai's builder defaults.
DEFAULT_ACCURACY_LEVELS = {"cpu": 4, "cuda": 0}
# (bits, block size) at which ONNX Runtime 1.32's CPU MatMulNBits computes a row alone (a decode step) bit for bit
# as among the rows of a verify step, at accuracy_level 4, by the vector ISA whose int8 kernels it runs: measured for
# K = 256 to 3584 on AVX-512 machines (Intel Xeon, AMD EPYC) and an AVX2-only one (AMD EPYC)
# (docs/lossless-speculative.md#quantized-weights-on-the-cpu). No setting of onnxruntime-gpu 1.31.1's CUDA kernel is.
CPU_ROW_INVARIANT_BY_ISA = {"AVX-512": frozenset({(4, 32), (8, 32), (8, 64)}),
                            "AVX2": frozenset({(8, 32), (8, 64), (8, 128)})}
# An export does not know which CPU will run it: it promises what holds on every ISA measured.
CPU_ROW_INVARIANT = frozenset.intersection(*CPU_ROW_INVARIANT_BY_ISA.values())


def cpu_int8_products(quant: QuantOptions | None) -> bool:
    """Whether our CPU QuantizedLinear multiplies int8 input rows for these weights (accuracy level 4, 4-bit codes in
    blocks of a multiple of 32): the CPU kernel that beats MatMulNBits, which the exporter then writes by default;
    below level 4 it dequantizes the weights on every call (docs/op-contract.md#quantizedlinear)."""
    return (quant is not None and quant.spec.bits == contract.QUANTIZED_LINEAR_BITS
            and quant.accuracy_level == contract.QUANTIZED_LINEAR_INT8_LEVEL and quant.spec.block_size % 32 == 0)


def verify_not_lossless(quant: QuantOptions | None, execution_provider: str, linear_op: bool = False,
                        quantized_linear_op: bool = False, routed_experts: bool = False) -> str | None:
    """Why speculative verify steps of an export may not give plain decoding's tokens (None: they do, as far as
    measured): the MatMulNBits settings at which ONNX Runtime rounds a row by the rows beside it (on the CPU also
    those of the routed experts beside QuantizedLinear), our Linear on CUDA, whose one-row kernel and cuBLAS round a
    row differently, or, beside QuantizedLinear (whose rows do not depend on each other, up to 64 a step on CUDA),
    the products a CUDA export leaves to ORT's ops."""
    if linear_op and execution_provider != "cpu":
        return ("Linear (--linear-op) computes a one-row decode step with its own kernel and a verify step's rows "
                "with cuBLAS, which round a row differently")
    if quant is None:
        return None
    if execution_provider != "cpu":
        if not (quantized_linear_op and quant.spec.bits == contract.QUANTIZED_LINEAR_BITS):
            return (f"onnxruntime-gpu's {execution_provider.upper()} MatMulNBits computes a row alone (decode) and "
                    f"among others (verify) in different orders")
        left = [what for what, kept in (("the lm_head (--quantize-lm-head)", not quant.lm_head),
                                        ("the GatedDeltaNet's b and a gates (--quantize-gates)", not quant.gates),
                                        ("the routed experts (QMoE or MoE)", routed_experts)) if kept]
        if left:
            return (f"QuantizedLinear keeps a row's bits whatever the rows beside it (up to 64 a step), but "
                    f"{', '.join(left)} run on ORT's CUDA kernels, not known to do the same")
        return None
    if quantized_linear_op and quant.spec.bits == contract.QUANTIZED_LINEAR_BITS and not routed_experts:
        return None  # QuantizedLinear's CPU rows never depend on each other
    setting = (quant.spec.bits, quant.spec.block_size)
    if quant.accuracy_level == 4 and setting in CPU_ROW_INVARIANT:
        return None
    only_on = [isa for isa, settings in CPU_ROW_INVARIANT_BY_ISA.items() if setting in settings]
    where = (f"only on {' and '.join(only_on)} CPUs (its kernels differ by vector ISA)"
             if quant.accuracy_level == 4 and only_on else "on no CPU measured")
    everywhere = " or ".join(f"int{bits} block {block}" for bits, block in sorted(CPU_ROW_INVARIANT))
    return (f"ONNX Runtime's CPU MatMulNBits computes a row alone (decode) as among other rows (verify) at "
            f"{quant.spec.bits}-bit weights, block {quant.spec.block_size}, accuracy_level {quant.accuracy_level} "
            f"{where}; on every CPU measured it does at accuracy_level 4 with {everywhere}")


def quant_options(weights: str | None, dtype: str, *, block_size: int = 32, asymmetric: bool = False,
                  accuracy_level: int | None = None, lm_head: bool = False, embedding: bool = False,
                  gates: bool = False, execution_provider: str = "cpu") -> QuantOptions | None:
    """The export's weight quantization from its options; None when ``weights`` is the activation type."""
    if weights in (None, dtype):
        given = [f"{name} (--{name.replace('_', '-')})" for name, on in (
            ("weight_block", block_size != BLOCK_SIZES[0]), ("weight_asymmetric", asymmetric),
            ("accuracy_level", accuracy_level is not None), ("quantize_lm_head", lm_head),
            ("quantize_embedding", embedding), ("quantize_gates", gates)) if on]
        if given:
            raise ExportError(f"{', '.join(given)}: options of quantized weights, which need weights int4 or int8 "
                              f"(--weights)")
        return None
    if weights not in WEIGHT_TYPES:
        raise ExportError(f"weights must be int4, int8 or the activation dtype {dtype}, got {weights!r}")
    if block_size not in BLOCK_SIZES:
        raise ExportError(f"weight_block must be one of {', '.join(map(str, BLOCK_SIZES))}, got {block_size}")
    level = DEFAULT_ACCURACY_LEVELS.get(execution_provider, 0) if accuracy_level is None else accuracy_level
    if level not in range(5):
        raise ExportError(f"accuracy_level must be 0 (unset), 1 (fp32), 2 (fp16), 3 (bf16) or 4 (int8), got {level}")
    spec = QuantSpec(WEIGHT_TYPES[weights], block_size, symmetric=not asymmetric)
    return QuantOptions(spec, level, lm_head=lm_head, embedding=embedding, gates=gates,
                        execution_provider=execution_provider)
