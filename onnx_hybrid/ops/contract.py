"""The operator contract of GatedDeltaNet, VarlenCausalConvWithState and PagedAttention.

This module is where the package states the operators' inputs, outputs, attributes, type constraints,
capsule layout, thresholds and rejection messages (docs/op-contract.md; ORT 1.31.1's compact ABI; PagedAttention
is our CPU subset of ORT's CUDA op). Each rule has one source:

* **Tables, here.** Ports, attributes with their defaults and ranges, messages, the capsule layout and
  :data:`SEQUENTIAL_MIN_TOKENS` are Python data, because every consumer can read them: the build generates the
  C++ header the kernels use from this module (``native/build/gen_contract_header.py``), and the engine threshold
  reaches the CUDA kernels as an NVRTC define (``cuda_ops/compiler.py``); the exporter emits nodes through
  :func:`make_onnx_node` / :func:`make_ir_node`, the config validator computes capsule widths with
  :func:`gdn_capsule_width` / :func:`conv_capsule_shape`.
* **Shape, presence and offset checks, in the library** (``native/shapes/*.cc``), and the element types of the
  ports that ORT lets through untyped (GatedDeltaNet's decay and beta). ORT's kernels must check their
  inputs without calling back into Python, so the C++ checks are the implementation; :func:`resolve_gdn`,
  :func:`resolve_conv`, :func:`resolve_paged_attention`, :func:`check_offsets` and :func:`check_paged_rows` (the
  float64 reference's, the tests', the CUDA API's) and the presence rules of :func:`layout_node` call them through
  the library's C entry points (``ops/c_api.py``), and a rejection comes back as :class:`ContractError` with its
  ``key``. The other element types ORT checks when it picks a kernel; :func:`check_types` states them here only
  so that a node builder names the tensor (ORT's lookup error names none).

The module itself depends on nothing outside the standard library, so that the build can import it; the checks
load the library when first called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, Mapping, Sequence, TypeVar

DOMAIN = "onnx_hybrid"
MS_DOMAIN = "com.microsoft"
OPSET_VERSION = 1
MAX_STATE_UPDATE_CAPACITY = 8
L2_NORM_EPS = 1e-12
SOFTPLUS_THRESHOLD = 20.0
INT32_MAX = 2**31 - 1
# Engine rule 2 (docs/op-contract.md#engine-selection): a request of fewer tokens runs on the sequential engine.
# The CPU kernel and the CUDA launch plan read it from the generated header, the CUDA kernels from the
# -DOHK_SEQUENTIAL_MIN_TOKENS that cuda_ops/compiler.py passes NVRTC.
SEQUENTIAL_MIN_TOKENS = 32

# Element types by ONNX name. "T" is the activation type of an op; the others are fixed.
ACTIVATION_TYPES = ("float", "float16", "bfloat16")


@dataclass(frozen=True)
class Port:
    """One input or output of an operator."""

    index: int
    name: str
    # "T" (one of ACTIVATION_TYPES, shared by all T ports of the node), "float", "int32", "uint8", or "gate": float, or the
    # node's T (every gate port of the node alike), so that fp16/bf16 graphs need no Cast before the op
    type: str
    optional: bool
    host_memory: bool = False  # declared OrtMemTypeCPUInput on device execution providers
    doc: str = ""


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "string" | "int" | "ints" | "float"
    default: Any
    allowed: tuple | None = None  # allowed string values
    minimum: int | None = None  # of an int, or of each of ints
    maximum: int | None = None  # of an int, or the number of ints
    doc: str = ""


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    attributes: tuple[Attribute, ...]
    inplace: tuple[tuple[int, int], ...] = ()  # (input index, output index) pairs that may alias

    def input(self, name: str) -> Port:
        return _by_name(self.inputs, name, f"{self.name} input")

    def output(self, name: str) -> Port:
        return _by_name(self.outputs, name, f"{self.name} output")

    def attribute(self, name: str) -> Attribute:
        return _by_name(self.attributes, name, f"{self.name} attribute")


def _by_name(items, name, what):
    for item in items:
        if item.name == name:
            return item
    raise KeyError(f"unknown {what} {name!r}; known: {', '.join(i.name for i in items)}")


def _capacity_attribute() -> Attribute:
    return Attribute(
        "state_update_capacity", "int", 0, minimum=0, maximum=MAX_STATE_UPDATE_CAPACITY,
        doc="compact transition slots per request",
    )


# Update rule -> (has decay, has delta retrieval). docs/op-contract.md#sequential-definition.
UPDATE_RULES: dict[str, tuple[bool, bool]] = {
    "linear": (False, False),
    "gated": (True, False),
    "delta": (False, True),
    "gated_delta": (True, True),
}

GATED_DELTA_NET = OpSpec(
    name="GatedDeltaNet",
    inputs=(
        Port(0, "query", "T", False, doc="[T,Hq,Dk] | [B,S,Hq,Dk] | packed [T,W] | [B,S,W]"),
        Port(1, "key", "T", True, doc="[T,Hk,Dk] | [B,S,Hk,Dk]; absent in packed-QKV form"),
        Port(2, "value", "T", True, doc="[T,Hv,Dv] | [B,S,Hv,Dv]; absent in packed-QKV form"),
        Port(3, "cu_seqlens", "int32", True, doc="[B+1] exclusive prefix sums of request lengths"),
        Port(4, "decay", "gate", True, doc="[T,Hv] | [T,Hv,Dk] | [B,S,Hv] | [B,S,Hv,Dk]"),
        Port(5, "beta", "gate", True, doc="[T,Hv] | [B,S,Hv]"),
        Port(6, "initial_state", "float", True, doc="[B,Hv,Dv,Dk], V-major"),
        Port(7, "a_log", "float", True, doc="[Hv], raw A_log"),
        Port(8, "dt_bias", "float", True, doc="[Hv]"),
        Port(9, "capture_count", "int32", True, doc="[B]"),
        Port(10, "state_update_active", "int32", True, host_memory=True, doc="[1]"),
    ),
    outputs=(
        Port(0, "output", "T", False, doc="[T,Hv,Dv] | [B,S,Hv,Dv]"),
        Port(1, "final_state", "float", True, doc="[B,Hv,Dv,Dk], V-major"),
        Port(2, "state_update", "float", True, doc="[B, C*(Hv + Hk*Dk + Hv*Dv)]"),
    ),
    attributes=(
        Attribute("update_rule", "string", "gated_delta", allowed=tuple(UPDATE_RULES)),
        Attribute("scale", "float", 0.0, doc="0.0 means 1/sqrt(Dk)"),
        Attribute("gate_activation", "string", "none", allowed=("none", "qwen")),
        Attribute("beta_activation", "string", "none", allowed=("none", "sigmoid")),
        Attribute("qk_l2_norm", "int", 0, doc="nonzero: L2-normalise q and k heads"),
        Attribute("chunk_size", "int", 64, minimum=1, maximum=INT32_MAX, doc="tuning hint"),
        _capacity_attribute(),
    ),
    inplace=((6, 1),),
)

VARLEN_CAUSAL_CONV = OpSpec(
    name="VarlenCausalConvWithState",
    inputs=(
        Port(0, "input", "T", False, doc="[T,Ch] token-major"),
        Port(1, "weight", "T", False, doc="[Ch,1,K]; tap K-1 is the current token"),
        Port(2, "cumulative_sequence_length", "int32", False, doc="[B+1]"),
        Port(3, "bias", "T", True, doc="[Ch]"),
        Port(4, "initial_state", "T", False, doc="[B,Ch,SL], SL=(K-1)*dilation, oldest first"),
        Port(5, "capture_count", "int32", True, doc="[B]"),
    ),
    outputs=(
        Port(0, "output", "T", False, doc="[T,Ch]"),
        Port(1, "final_state", "T", False, doc="[B,Ch,SL]"),
        Port(2, "state_update", "T", True, doc="[B,cap,Ch]"),
    ),
    attributes=(
        Attribute("activation", "string", "none", allowed=("none", "silu", "swish")),
        Attribute("dilation", "int", 1, minimum=1, maximum=INT32_MAX),
        _capacity_attribute(),
    ),
    inplace=((4, 1),),
)

# The subset of com.microsoft::PagedAttention (ORT contrib op, CUDA only) that the paged export uses, so
# that the paged graph runs on CPU: rotary, q/k norms, sinks and KV scales are applied outside the op,
# cache writes follow block_table (no slot mapping), and attention_metadata (a CUDA planning hint) is
# not an input. Any element type T, fp32 included, for activations and the pool alike.
PAGED_ATTENTION = OpSpec(
    name="PagedAttention",
    inputs=(
        Port(0, "query", "T", False, doc="[N, num_heads*D], N packed tokens of all requests"),
        Port(1, "key", "T", False, doc="[N, kv_num_heads*D]"),
        Port(2, "value", "T", False, doc="[N, kv_num_heads*D]"),
        Port(3, "key_cache", "T", False, doc="[num_blocks, block_size, kv_num_heads, D]"),
        Port(4, "value_cache", "T", False, doc="[num_blocks, block_size, kv_num_heads, D]"),
        Port(5, "cumulative_sequence_lengths", "int32", False, doc="[B+1] offsets of the requests' tokens"),
        Port(6, "past_sequence_lengths", "int32", False, doc="[B] cached positions of each request"),
        Port(7, "block_table", "int32", False, doc="[B, max_num_blocks] pool block of each block of positions"),
    ),
    outputs=(
        Port(0, "output", "T", False, doc="[N, num_heads*D]"),
        Port(1, "key_cache_out", "T", False, doc="key_cache with this call's keys written"),
        Port(2, "value_cache_out", "T", False, doc="value_cache with this call's values written"),
    ),
    attributes=(
        Attribute("num_heads", "int", 0, minimum=1, maximum=INT32_MAX, doc="query heads; required"),
        Attribute("kv_num_heads", "int", 0, minimum=1, maximum=INT32_MAX, doc="key/value heads; required"),
        Attribute("scale", "float", 0.0, doc="0.0 means 1/sqrt(D)"),
    ),
    inplace=((3, 1), (4, 2)),
)

# A projection y = input @ weight^T with the weight stored [out_features, in_features] as checkpoints hold it: what
# ONNX's Gemm(transB=1) computes. Its CUDA kernel reads the weight at the copy rate for the one row of a decode
# step (docs/op-contract.md#linear). activation "swiglu" takes a SwiGLU MLP's packed gate and up rows and gives
# SiLU(gate) * up; output_features splits the output columns over up to LINEAR_MAX_OUTPUTS outputs (a packed
# projection's parts): each a launch fewer than the Split, SiLU and Mul nodes they replace.
LINEAR_MAX_OUTPUTS = 4
LINEAR = OpSpec(
    name="Linear",
    inputs=(
        Port(0, "input", "T", False, doc="[rows, in_features]"),
        Port(1, "weight", "T", False, doc="[out_features, in_features]; swiglu: gate rows, then as many up rows"),
    ),
    outputs=(
        Port(0, "output", "T", False, doc="[rows, out_features]; swiglu: [rows, out_features / 2]; with "
                                          "output_features [rows, output_features[0]]"),
        *(Port(i, f"output_{i}", "T", True, doc=f"[rows, output_features[{i}]]") for i in range(1, LINEAR_MAX_OUTPUTS)),
    ),
    attributes=(
        Attribute("activation", "string", "none", allowed=("none", "swiglu")),
        Attribute("output_features", "ints", (), minimum=1, maximum=LINEAR_MAX_OUTPUTS,
                  doc="the columns of each output, in order; empty: one output of them all"),
    ),
)


# QuantizedLinear: Linear with 4-bit block-quantized weights in com.microsoft::MatMulNBits' layout (the same
# initializers), so that its CUDA kernel reads a quarter of the fp16 bytes at the copy rate and keeps Linear's
# epilogues. Each weight element is T((q - zero_point) * scale), rounded once in T (docs/op-contract.md#quantizedlinear).
# accuracy_level as MatMulNBits': at QUANTIZED_LINEAR_INT8_LEVEL the CPU kernel multiplies int8 input rows.
QUANTIZED_LINEAR_BITS = 4
QUANTIZED_LINEAR_INT8_LEVEL = 4
QUANTIZED_LINEAR = OpSpec(
    name="QuantizedLinear",
    inputs=(
        Port(0, "input", "T", False, doc="[rows, in_features]"),
        Port(1, "weight", "uint8", False, doc="[weight rows, blocks, block_size / 2]: two elements a byte, the even "
                                              "one in the low nibble; blocks = ceil(in_features / block_size)"),
        Port(2, "scales", "T", False, doc="[weight rows, blocks]"),
        Port(3, "zero_points", "uint8", True, doc="[weight rows, ceil(blocks / 2)], two blocks a byte (low nibble "
                                                  "first); absent: 8"),
    ),
    outputs=LINEAR.outputs,
    attributes=(
        *LINEAR.attributes,
        Attribute("block_size", "int", 32, minimum=16, doc="elements per scale: a power of two"),
        Attribute("bits", "int", QUANTIZED_LINEAR_BITS, minimum=QUANTIZED_LINEAR_BITS,
                  maximum=QUANTIZED_LINEAR_BITS, doc="bits per weight element"),
        Attribute("accuracy_level", "int", 0, minimum=0, maximum=QUANTIZED_LINEAR_INT8_LEVEL,
                  doc="MatMulNBits' levels; 4: int8 input rows on the CPU (block_size a multiple of 32)"),
    ),
)


def linear_output_names(output_features: Sequence[int] = ()) -> list[str]:
    """The outputs of a Linear node with these output_features: output, output_1, ..., one per size (the kernels
    check the node against this)."""
    return [port.name for port in LINEAR.outputs[:max(1, len(output_features))]]


OPS: dict[str, OpSpec] = {op.name: op for op in (GATED_DELTA_NET, VARLEN_CAUSAL_CONV, PAGED_ATTENTION, LINEAR,
                                                 QUANTIZED_LINEAR)}
# The ops the library also registers under com.microsoft (ORT's own names for the two state ops, which a graph may
# use with --op-domain com.microsoft); PagedAttention and Linear live in our domain only.
MS_DOMAIN_OPS = frozenset({GATED_DELTA_NET.name, VARLEN_CAUSAL_CONV.name})


# --------------------------------------------------------------------------------------------------
# Rejection messages. Templates use positional fields {0}, {1}, ...; the C++ side gets the same
# templates through the generated header and fills them with the same arguments. Every message
# names the tensor or attribute and, where there is one, the expected and the actual value.
# --------------------------------------------------------------------------------------------------

MESSAGES: dict[str, str] = {
    # Element types, checked where a node is built (graph builders), before a runtime sees the node
    "input_type": "{0} must be {1}, got {2}",
    "input_type_activation": "{0} must be one of float, float16, bfloat16 (the activation type T), got {1}",
    "input_type_shared": "{0} must have the activation type T of {1}: expected {2}, got {3}",
    "gate_type": "decay and beta must be float, or both of the activation type {0}: got decay {1}, beta {2}",
    # GatedDeltaNet, kernel creation
    "gdn_update_rule": "update_rule must be one of: linear, gated, delta, gated_delta; got '{0}'",
    "gdn_gate_activation": "gate_activation must be one of: none, qwen; got '{0}'",
    "gdn_beta_activation": "beta_activation must be one of: none, sigmoid; got '{0}'",
    "chunk_size": "chunk_size must be positive and fit in int32, got {0}",
    "capacity": f"state_update_capacity must be in [0, {MAX_STATE_UPDATE_CAPACITY}], got {{0}}",
    # GatedDeltaNet, run
    "gdn_kv_presence": "key and value must be both present or both absent; got key {0}, value {1}",
    "gdn_rank": "query, key and value must be rank 3 [total_tokens, num_heads, head_size] or rank 4 "
                "[batch, sequence, num_heads, head_size]; got query rank {0}",
    "gdn_packed_rank": "packed QKV must be rank 2 [total_tokens, packed_size] or rank 3 "
                       "[batch, sequence, packed_size]; got query rank {0}",
    "gdn_same_rank": "query, key and value must have the same rank; got query {0}, key {1}, value {2}",
    "gdn_tokens_agree": "query, key and value must agree on total_tokens; got query {0}, key {1}, value {2}",
    "gdn_total_tokens": "total_tokens must be positive and fit in int32, got {0}",
    "gdn_head_size": "key head_size must equal query head_size: expected {0}, got {1}",
    "gdn_heads_qk": "num_heads_q ({0}) must equal num_heads_k ({1})",
    "gdn_heads_v": "num_heads_v ({0}) must be a positive multiple of num_heads_q ({1})",
    "gdn_packed_needs_state": "initial_state is required to derive packed QKV dimensions",
    "gdn_packed_width": "packed QKV last dimension must be 2 * num_heads_q * head_size_qk + "
                        "num_heads_v * head_size_v; got {0}, which leaves {1} for 2 * num_heads_q * {2}",
    "gdn_packed_dims": "packed QKV head counts and head sizes must be positive and fit in int32; got "
                       "num_heads_q {0}, head_size_qk {1}, num_heads_v {2}, head_size_v {3}",
    "gdn_cu_rank4": "cu_seqlens describes ragged packing, so query/key/value must be rank 3; got rank {0}",
    "gdn_cu_shape": "cu_seqlens must be rank 1 with at least 2 elements; got shape {0}",
    "gdn_uniform_needs_state": "cu_seqlens is absent, so initial_state is required to determine batch size",
    "gdn_uniform_divisible": "total_tokens ({0}) must be divisible by batch ({1})",
    "gdn_batch": "batch size must be positive and fit in int32, got {0}",
    "gdn_state_rank": "initial_state must be rank 4 [batch, num_heads_v, head_size_v, head_size_qk], "
                      "got rank {0}",
    "gdn_state_shape": "initial_state must be [batch, num_heads_v, head_size_v, head_size_qk] (V-major): "
                       "expected {0}, got {1}",
    "gdn_decay_presence": "decay input presence must match update_rule: update_rule '{0}' {1} decay, "
                          "but decay is {2}",
    "gdn_beta_presence": "beta input presence must match update_rule: update_rule '{0}' {1} beta, "
                         "but beta is {2}",
    "gdn_decay_shape": "decay must be [...tokens, num_heads_v] or [...tokens, num_heads_v, head_size_qk]: "
                       "expected {0} or {1}, got {2}",
    "gdn_decay_perkey": "per-key-dim decay last axis must be head_size_qk: expected {0}, got {1}",
    "gdn_beta_shape": "beta must be [...tokens, num_heads_v]: expected {0}, got {1}",
    "gdn_qwen_needs_gates": "gate_activation=qwen requires a_log and dt_bias; got a_log {0}, dt_bias {1}",
    "gdn_gates_need_qwen": "a_log and dt_bias require gate_activation=qwen; got gate_activation '{0}'",
    "gdn_a_log_shape": "a_log must be [num_heads_v]: expected {0}, got {1}",
    "gdn_dt_bias_shape": "dt_bias must be [num_heads_v]: expected {0}, got {1}",
    "capture_presence": "capture_count must be present exactly when state_update_capacity is positive; "
                        "got state_update_capacity {0}, capture_count {1}",
    "gdn_capture_shape": "capture_count must be [batch]: expected {0}, got {1}",
    "gdn_capture_perkey": "transition capture does not support per-key-dimension decay (decay shape {0})",
    "gdn_active_shape": "state_update_active must be [1], got {0}",
    "gdn_cu_bounds": "cu_seqlens must start at 0 and end at total_tokens: expected cu_seqlens[0] = 0 and "
                     "cu_seqlens[{0}] = {1}, got {2} and {3}",
    "gdn_cu_order": "cu_seqlens must be non-decreasing: cu_seqlens[{0}] = {1} follows cu_seqlens[{2}] = {3}",
    # VarlenCausalConvWithState, kernel creation
    "conv_activation": "activation must be one of: none, silu, swish; got '{0}'",
    "conv_dilation": "dilation must be >= 1, got {0}",
    # VarlenCausalConvWithState, run
    "conv_cu_required": "cumulative_sequence_length input is required",
    "conv_state_required": "initial_state input is required",
    "conv_input_rank": "input must be rank 2 (total_tokens, channels), got rank {0}",
    "conv_cu_rank": "cumulative_sequence_length must be rank 1 (batch_size + 1), got rank {0}",
    "conv_weight_rank": "weight must be rank 3 (channels, 1, kernel_size), got rank {0}",
    "conv_cu_size": "cumulative_sequence_length must have at least 2 elements (batch_size >= 1), got {0}",
    "conv_channels": "input channel dimension must be positive, got {0}",
    "conv_kernel_size": "weight last dim (kernel_size) must be positive, got {0}",
    "conv_weight_channels": "weight channels must equal input channels: expected {0}, got {1}",
    "conv_weight_middle": "weight middle dimension must be 1, got {0}",
    "conv_bias_shape": "bias must have shape (channels): expected {0}, got {1}",
    "conv_state_shape": "initial_state must have shape (B, Ch, SL): expected {0}, got {1}",
    "conv_tokens_vs_batch": "total_tokens must be at least batch_size because every sequence must contain "
                            "a token; got total_tokens {0}, batch_size {1}",
    "conv_capture_shape": "capture_count must have shape (batch_size): expected {0}, got {1}",
    "conv_cu_bounds": "cumulative_sequence_length must start at 0 and end at total_tokens: expected "
                      "cumulative_sequence_length[0] = 0 and cumulative_sequence_length[{0}] = {1}, "
                      "got {2} and {3}",
    "conv_cu_order": "cumulative_sequence_length must be non-decreasing: cumulative_sequence_length[{0}] = "
                     "{1} follows cumulative_sequence_length[{2}] = {3}",
    # Linear, kernel creation
    "linear_activation": "activation must be one of: none, swiglu; got '{0}'",
    "linear_output_features": f"output_features must hold at most {LINEAR_MAX_OUTPUTS} positive sizes; got {{0}}",
    "linear_outputs": "the node's outputs must be output, output_1, ... in order, one for each size of "
                      "output_features (output alone without them); got {0} leading outputs (-1: not in order) for "
                      "output_features {1}",
    "linear_swiglu_outputs": "activation swiglu gives one output; got output_features {0}",
    # Linear, run
    "linear_swiglu_rows": "activation swiglu needs an even number of weight rows (gate rows, then up rows); "
                          "got {0}",
    "linear_output_sum": "output_features must sum to the weight's rows: expected {0}, got {1} (sum {2})",
    "linear_rank": "input must be rank 2 [rows, in_features] and weight rank 2 [out_features, in_features]; got "
                   "input shape {0}, weight shape {1}",
    "linear_in_features": "weight in_features must equal input's: expected {0}, got {1}",
    "linear_empty_features": "in_features must be positive, got {0}",
    # QuantizedLinear, kernel creation and run (its activation and output_features as Linear's)
    "qlinear_block_size": "block_size must be a power of two of at least 16; got {0}",
    "qlinear_bits": f"bits must be {QUANTIZED_LINEAR_BITS}; got {{0}}",
    "qlinear_accuracy_level": f"accuracy_level must be 0 to {QUANTIZED_LINEAR_INT8_LEVEL}; got {{0}}",
    "qlinear_rank": "input must be rank 2 [rows, in_features] and weight rank 3 [weight rows, blocks, "
                    "block_size / 2]; got input shape {0}, weight shape {1}",
    "qlinear_weight_blocks": "weight must have shape [weight rows, {0}, {1}] for in_features {2} and block_size "
                             "{3}; got {4}",
    "qlinear_scales": "scales must have shape [{0}, {1}] (weight rows, blocks); got {2}",
    "qlinear_zero_points": "zero_points must have shape [{0}, {1}] (weight rows, ceil(blocks / 2)); got {2}",
    # PagedAttention, kernel creation
    "pa_num_heads": "num_heads must be a positive int32, got {0}",
    "pa_kv_num_heads": "kv_num_heads must be a positive int32, got {0}",
    "pa_heads": "num_heads ({0}) must be a multiple of kv_num_heads ({1})",
    # PagedAttention, run
    "pa_cache_rank": "{0} must be rank 4 [num_blocks, block_size, kv_num_heads, head_size], got shape {1}",
    "pa_cache_dims": "key_cache block_size and head_size must be positive and kv_num_heads must be {0}; "
                     "got shape {1}",
    "pa_cache_same": "value_cache must have the shape of key_cache: expected {0}, got {1}",
    "pa_tensor_shape": "{0} must be [num_tokens, {1}]: expected [{2}, {3}], got {4}",
    "pa_cu_shape": "cumulative_sequence_lengths must be rank 1 with at least 2 elements; got shape {0}",
    "pa_past_shape": "past_sequence_lengths must be [batch]: expected {0}, got {1}",
    "pa_block_table_shape": "block_table must be [batch, max_num_blocks] with batch {0}; got shape {1}",
    "pa_cu_bounds": "cumulative_sequence_lengths must start at 0 and end at num_tokens: expected "
                    "cumulative_sequence_lengths[0] = 0 and cumulative_sequence_lengths[{0}] = {1}, got {2} and {3}",
    "pa_cu_order": "cumulative_sequence_lengths must be non-decreasing: cumulative_sequence_lengths[{0}] = {1} "
                   "follows cumulative_sequence_lengths[{2}] = {3}",
    "pa_past_range": "past_sequence_lengths[{0}] must be in [0, {1}] so that positions fit in int32, got {2}",
    "pa_block_columns": "request {0} reaches position {1}, which needs {2} block_table columns; block_table "
                        "has {3}",
    "pa_block_index": "block_table[{0}, {1}] = {2} is not a block of the pool: expected 0 <= block < {3}",
}


class ContractError(ValueError):
    """An input violates the operator contract. ``key`` names the MESSAGES entry."""

    def __init__(self, op: str, key: str, *args: Any):
        self.op = op
        self.key = key
        self.args_ = args
        super().__init__(format_message(op, key, *args))

    @classmethod
    def from_message(cls, op: str, message: str, key: str | None = None) -> "ContractError":
        """The rejection the native library's checks made (they report the formatted message and its key)."""
        error = cls.__new__(cls)
        error.op, error.key, error.args_ = op, key or None, ()
        ValueError.__init__(error, message)
        return error

    @classmethod
    def from_library(cls, op: str) -> "ContractError":
        """The native library's last rejection on this thread (after an entry point returned its code)."""
        from .library import control

        lib = control()
        return cls.from_message(op, lib.onnx_hybrid_last_error().decode(), lib.onnx_hybrid_last_error_key().decode())


def format_message(op: str, key: str, *args: Any) -> str:
    return f"{op}: " + MESSAGES[key].format(*(_fmt(a) for a in args))


def _fmt(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


# --------------------------------------------------------------------------------------------------
# Attributes
# --------------------------------------------------------------------------------------------------


def resolve_attributes(op: OpSpec, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults filled in, values checked as at kernel creation. Unknown names are rejected."""
    given = dict(given or {})
    out: dict[str, Any] = {}
    for attr in op.attributes:
        value = given.pop(attr.name, attr.default)
        out[attr.name] = _check_attribute(op, attr, value)
    if given:
        raise ValueError(f"{op.name}: unknown attribute(s) {sorted(given)}; known: "
                         f"{', '.join(a.name for a in op.attributes)}")
    return out


_ALLOWED_KEYS = {
    ("GatedDeltaNet", "update_rule"): "gdn_update_rule",
    ("GatedDeltaNet", "gate_activation"): "gdn_gate_activation",
    ("GatedDeltaNet", "beta_activation"): "gdn_beta_activation",
    ("GatedDeltaNet", "chunk_size"): "chunk_size",
    ("GatedDeltaNet", "state_update_capacity"): "capacity",
    ("VarlenCausalConvWithState", "activation"): "conv_activation",
    ("VarlenCausalConvWithState", "dilation"): "conv_dilation",
    ("VarlenCausalConvWithState", "state_update_capacity"): "capacity",
    ("PagedAttention", "num_heads"): "pa_num_heads",
    ("PagedAttention", "kv_num_heads"): "pa_kv_num_heads",
    ("Linear", "activation"): "linear_activation",
    ("Linear", "output_features"): "linear_output_features",
    ("QuantizedLinear", "activation"): "linear_activation",
    ("QuantizedLinear", "output_features"): "linear_output_features",
    ("QuantizedLinear", "block_size"): "qlinear_block_size",
    ("QuantizedLinear", "bits"): "qlinear_bits",
    ("QuantizedLinear", "accuracy_level"): "qlinear_accuracy_level",
}


def attribute_message_key(op: OpSpec, attr: Attribute) -> str | None:
    return _ALLOWED_KEYS.get((op.name, attr.name))


def _check_attribute(op: OpSpec, attr: Attribute, value: Any) -> Any:
    key = attribute_message_key(op, attr)
    if attr.kind == "string":
        value = value.decode() if isinstance(value, bytes) else str(value)
        if attr.allowed is not None and value not in attr.allowed:
            raise ContractError(op.name, key, value)
    elif attr.kind == "ints":
        value = tuple(int(v) for v in value)
        if (attr.minimum is not None and any(v < attr.minimum for v in value)) or (
            attr.maximum is not None and len(value) > attr.maximum
        ):
            raise ContractError(op.name, key, list(value))
    elif attr.kind == "int":
        value = int(value)
        if (attr.minimum is not None and value < attr.minimum) or (
            attr.maximum is not None and value > attr.maximum
        ):
            raise ContractError(op.name, key, value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{op.name}: attribute {attr.name} must be finite, got {value}")
    return value


# --------------------------------------------------------------------------------------------------
# Capsule layouts (docs/op-contract.md#capsule-layout, #conv-capsule-and-replay)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GdnCapsuleLayout:
    """Offsets of the three struct-of-arrays blocks in one row of a GatedDeltaNet ``state_update``."""

    capacity: int
    num_heads_v: int
    num_heads_k: int
    head_size_k: int
    head_size_v: int

    @property
    def decay_offset(self) -> int:
        return 0

    @property
    def key_offset(self) -> int:
        return self.capacity * self.num_heads_v

    @property
    def delta_offset(self) -> int:
        return self.capacity * (self.num_heads_v + self.num_heads_k * self.head_size_k)

    @property
    def width(self) -> int:
        return gdn_capsule_width(self.capacity, self.num_heads_v, self.num_heads_k, self.head_size_k,
                                 self.head_size_v)

    def split(self, row):
        """Views (decay [C,Hv], key [C,Hk,Dk], delta [C,Hv,Dv]) of one capsule row (NumPy-like)."""
        c, hv, hk, dk, dv = (self.capacity, self.num_heads_v, self.num_heads_k, self.head_size_k,
                             self.head_size_v)
        decay = row[self.decay_offset:self.key_offset].reshape(c, hv)
        key = row[self.key_offset:self.delta_offset].reshape(c, hk, dk)
        delta = row[self.delta_offset:self.width].reshape(c, hv, dv)
        return decay, key, delta


def gdn_capsule_width(capacity: int, num_heads_v: int, num_heads_k: int, head_size_k: int,
                      head_size_v: int) -> int:
    """Width of one ``state_update`` row: C * (Hv + Hk*Dk + Hv*Dv)."""
    return capacity * (num_heads_v + num_heads_k * head_size_k + num_heads_v * head_size_v)


def conv_state_length(kernel_size: int, dilation: int) -> int:
    return (kernel_size - 1) * dilation


def conv_capsule_shape(batch, capacity: int, channels):
    """Shape of the conv ``state_update``: [B, capacity, Ch] in the activation type."""
    return [batch, capacity, channels]


def captured_prefix(capture_count: int, capacity: int, length: int) -> int:
    """m = clamp(capture_count, 0, min(C, n)): how many slots of a row are written."""
    return max(0, min(int(capture_count), capacity, length))


# --------------------------------------------------------------------------------------------------
# Shape resolution. Inputs are given as shapes (tuples) or None for absent; the functions raise
# ContractError with the same messages the kernels use, and return the resolved geometry.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GdnGeometry:
    layout: str  # "ragged" | "uniform" | "rank4" | "packed_ragged" | "packed_uniform" | "packed_rank3"
    batch: int
    total_tokens: int
    num_heads_q: int
    num_heads_k: int
    num_heads_v: int
    head_size_k: int
    head_size_v: int
    per_key_decay: bool
    capacity: int
    output_shape: tuple
    state_shape: tuple
    capsule_width: int

    @property
    def group(self) -> int:
        """Value heads per q/k head (G = Hv / Hq)."""
        return self.num_heads_v // self.num_heads_q

    @property
    def packed(self) -> bool:
        return self.layout.startswith("packed")

    @property
    def token_rows(self) -> bool:
        """True when rows are addressed by cu_seqlens (ragged)."""
        return self.layout in ("ragged", "packed_ragged")

    def capsule_layout(self) -> GdnCapsuleLayout:
        return GdnCapsuleLayout(self.capacity, self.num_heads_v, self.num_heads_k, self.head_size_k,
                                self.head_size_v)


def resolve_gdn(shapes: Mapping[str, Sequence[int] | None], attributes: Mapping[str, Any],
                types: Mapping[str, str | None] | None = None) -> GdnGeometry:
    """Check a GatedDeltaNet call's input shapes (docs/op-contract.md#gateddeltanet-layouts, #head-geometry,
    #rejections) and resolve its geometry; the checks are the native library's (see the module's docstring).

    ``shapes`` maps input names to shapes; missing names or None mean absent. ``attributes`` must be
    resolved (see :func:`resolve_attributes`). ``types`` (ONNX element type names, None where unknown): with the
    query's, the gate ports' types are checked too (float, or both the query's).
    """
    from .c_api import resolve_gdn as native

    return native(shapes, attributes, types)


def check_offsets(op: str, offsets: Sequence[int], total_tokens: int) -> list[tuple[int, int]]:
    """Validate host-resident offsets like ORT 1.32 CPU; return (start, length) per request. The native library's
    check (GatedDeltaNet, VarlenCausalConvWithState)."""
    from .c_api import check_offsets as native

    return native(op, offsets, total_tokens)


@dataclass(frozen=True)
class PagedAttentionGeometry:
    batch: int
    num_tokens: int
    num_heads: int
    kv_num_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_num_blocks: int  # block_table columns
    scale: float  # resolved: 1/sqrt(D) when the attribute is 0

    @property
    def group(self) -> int:
        """Query heads per KV head: query head h reads KV head h // group."""
        return self.num_heads // self.kv_num_heads


def resolve_paged_attention(shapes: Mapping[str, Sequence[int] | None],
                            attributes: Mapping[str, Any]) -> PagedAttentionGeometry:
    """Check a PagedAttention call's input shapes (docs/op-contract.md#pagedattention); ``attributes`` resolved.
    The native library's checks."""
    from .c_api import resolve_paged_attention as native

    return native(shapes, attributes)


def check_paged_rows(geo: PagedAttentionGeometry, offsets: Sequence[int], past: Sequence[int],
                     block_table) -> list[tuple[int, int, int]]:
    """Validate the host-resident offsets, past lengths and the block_table columns each request reaches;
    return (start, length, past) per request. ``block_table`` is [batch, max_num_blocks]. The native library's
    check."""
    from .c_api import check_paged_rows as native

    return native(geo, offsets, past, block_table)


@dataclass(frozen=True)
class ConvGeometry:
    batch: int
    total_tokens: int
    channels: int
    kernel_size: int
    state_length: int
    capacity: int


def resolve_conv(shapes: Mapping[str, Sequence[int] | None], attributes: Mapping[str, Any]) -> ConvGeometry:
    """Check a VarlenCausalConvWithState call's input shapes (docs/op-contract.md#varlencausalconvwithstate).
    The native library's checks."""
    from .c_api import resolve_conv as native

    return native(shapes, attributes)


# --------------------------------------------------------------------------------------------------
# Node builders
# --------------------------------------------------------------------------------------------------

V = TypeVar("V")


@dataclass
class NodeLayout(Generic[V]):
    """A node's positional inputs and outputs (None = omitted, trailing omissions trimmed) and the
    attributes that differ from their defaults."""

    op: OpSpec
    inputs: list
    outputs: list
    attributes: dict = field(default_factory=dict)


def layout_node(op: OpSpec | str, inputs: Mapping[str, V | None], outputs: Mapping[str, V | None] | Sequence,
                attributes: Mapping[str, Any] | None = None, types: Mapping[str, str | None] | None = None
                ) -> NodeLayout:
    """Order inputs/outputs by position and keep non-default attributes.

    Presence rules that do not depend on shapes (decay iff the rule decays, beta iff it retrieves,
    a_log/dt_bias iff qwen, capture_count iff capacity > 0, key and value together, packed q/k/v with a state,
    the conv's state, PagedAttention's head ratio) are checked here by the kernels' own checks
    (:func:`_check_presence`), so the exporter cannot emit a node the kernels would reject for them.
    ``types`` (input name -> ONNX element type name, None where unknown) are checked by :func:`check_types`.
    """
    op = OPS[op] if isinstance(op, str) else op
    attrs = resolve_attributes(op, attributes)
    unknown = set(inputs) - {p.name for p in op.inputs}
    if unknown:
        raise KeyError(f"{op.name}: unknown input(s) {sorted(unknown)}")
    known = {name: t for name, t in (types or {}).items() if inputs.get(name) is not None}
    check_types(op, known)
    present = {name for name, value in inputs.items() if value is not None}
    for port in op.inputs:
        if not port.optional and port.name not in present:
            raise ValueError(f"{op.name}: required input {port.name!r} is missing")
    _check_presence(op, present, attrs, known)

    ordered_in = _trim([inputs.get(p.name) for p in op.inputs])
    if isinstance(outputs, Mapping):
        unknown = set(outputs) - {p.name for p in op.outputs}
        if unknown:
            raise KeyError(f"{op.name}: unknown output(s) {sorted(unknown)}")
        ordered_out = _trim([outputs.get(p.name) for p in op.outputs])
    else:
        ordered_out = _trim(list(outputs))
    for port, value in zip(op.outputs, ordered_out + [None] * len(op.outputs)):
        if not port.optional and value is None:
            raise ValueError(f"{op.name}: required output {port.name!r} is missing")
    non_default = {a.name: attrs[a.name] for a in op.attributes if attrs[a.name] != a.default}
    return NodeLayout(op=op, inputs=ordered_in, outputs=ordered_out, attributes=non_default)


def _check_presence(op: OpSpec, present: set[str], attrs: Mapping[str, Any], types: Mapping[str, str | None]
                    ) -> None:
    """The kernels' shape checks on placeholder shapes of one token, one request and unit head sizes, for the
    inputs in ``present``: the shapes always agree, so only a presence or attribute rule can fail, or (GatedDeltaNet)
    the element types of its gate ports. (Linear has no optional inputs; which outputs it has follows its
    output_features, linear_output_names, and its kernels check that at session creation.)"""
    if op is GATED_DELTA_NET:
        packed = "key" not in present and "value" not in present
        ragged = "cu_seqlens" in present
        tokens = (1,) if ragged else (1, 1)  # ragged rows, else the rank-4 layout (which needs neither)
        width = (3,) if packed else (1, 1)  # packed: Hv*Dv + 2*Hq*Dk values per token
        shapes = {"query": tokens + width, "key": tokens + (1, 1), "value": tokens + (1, 1), "cu_seqlens": (2,),
                  "decay": tokens + (1,), "beta": tokens + (1,), "initial_state": (1, 1, 1, 1), "a_log": (1,),
                  "dt_bias": (1,), "capture_count": (1,), "state_update_active": (1,)}
        resolve_gdn({k: v for k, v in shapes.items() if k in present}, attrs, types)
    elif op is VARLEN_CAUSAL_CONV:
        shapes = {"input": (1, 1), "weight": (1, 1, 2), "cumulative_sequence_length": (2,), "bias": (1,),
                  "initial_state": (1, 1, conv_state_length(2, attrs["dilation"])), "capture_count": (1,)}
        resolve_conv({k: v for k, v in shapes.items() if k in present}, attrs)
    elif op is PAGED_ATTENTION:
        hq, hkv = attrs["num_heads"], attrs["kv_num_heads"]
        resolve_paged_attention({"query": (1, hq), "key": (1, hkv), "value": (1, hkv), "key_cache": (1, 1, hkv, 1),
                                 "value_cache": (1, 1, hkv, 1), "cumulative_sequence_lengths": (2,),
                                 "past_sequence_lengths": (1,), "block_table": (1, 1)}, attrs)


def check_types(op: OpSpec, types: Mapping[str, str | None]) -> None:
    """Element types of a node's inputs (ONNX names: float, float16, bfloat16, int32, ...; None = unknown).

    Fixed-type ports must have their type; the "T" ports must all have one activation type. Without this a
    mismatch reaches ONNX Runtime, whose kernel lookup fails with a message that names no tensor. The "gate" ports,
    which ORT lets through to the kernel whatever their type, are the kernels' check (:func:`layout_node` runs it).
    """
    first_t = None
    for port in op.inputs:
        actual = types.get(port.name)
        if actual is None or port.type == "gate":
            continue
        if port.type != "T":
            if actual != port.type:
                raise ContractError(op.name, "input_type", port.name, port.type, actual)
        elif actual not in ACTIVATION_TYPES:
            raise ContractError(op.name, "input_type_activation", port.name, actual)
        elif first_t is None:
            first_t = port.name, actual
        elif actual != first_t[1]:
            raise ContractError(op.name, "input_type_shared", port.name, first_t[0], first_t[1], actual)


def _trim(values: list) -> list:
    while values and values[-1] is None:
        values.pop()
    return values


def make_onnx_node(op: OpSpec | str, inputs: Mapping[str, str | None], outputs, attributes=None, *,
                   domain: str = DOMAIN, name: str | None = None, types: Mapping[str, str | None] | None = None):
    """An ``onnx.NodeProto`` (omitted inputs/outputs as empty names); ``types`` as in :func:`layout_node`."""
    import onnx.helper

    lay = layout_node(op, inputs, outputs, attributes, types)
    return onnx.helper.make_node(
        lay.op.name, [x or "" for x in lay.inputs], [y or "" for y in lay.outputs], name=name,
        domain=domain, **lay.attributes,
    )


def make_ir_node(op: OpSpec | str, inputs: Mapping[str, Any], outputs, attributes=None, *,
                 domain: str = DOMAIN, name: str | None = None):
    """An ``onnx_ir.Node``. ``outputs`` is a mapping or sequence of ``ir.Value`` (None = omitted).

    Inputs are type-checked where their element type is known (:func:`ir_element_type`).
    """
    import onnx_ir as ir

    types = {name: ir_element_type(value) for name, value in inputs.items() if value is not None}
    lay = layout_node(op, inputs, outputs, attributes, types)
    # onnx-ir needs a Value object for every output position; omitted middle outputs get an
    # unnamed value, which serialises as an empty name.
    outs = [y if y is not None else ir.Value(name="") for y in lay.outputs]
    return ir.node(lay.op.name, lay.inputs, lay.attributes, domain=domain, outputs=outs, name=name,
                   version=OPSET_VERSION if domain == DOMAIN else None)


# Standard ONNX ops whose first output has the element type of their first input: enough to follow an
# activation from the exporter's typed graph inputs and initializers, through Cast and the contract ops, to
# the next contract op, without writing types into the graph.
SAME_TYPE_AS_FIRST_INPUT = frozenset({
    "Add", "Concat", "Cos", "Div", "Exp", "Expand", "Gather", "Gemm", "Identity", "MatMul", "Mul", "Neg", "Pow",
    "Relu", "Reshape", "RMSNormalization", "Sigmoid", "Sin", "Slice", "Softmax", "Softplus", "Split", "Sqrt",
    "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze",
})


def ir_element_type(value) -> str | None:
    """ONNX name of an ``onnx_ir.Value``'s element type: declared, or derived from its producers; None if unknown."""
    import onnx_ir as ir

    while value is not None:
        if value.dtype is not None:
            return value.dtype.name.lower()
        node = value.producer()
        if node is None:
            return None
        if node.domain in ("", "ai.onnx") and node.op_type == "Cast":
            return ir.DataType(node.attributes["to"].value).name.lower()
        if node.domain in ("", "ai.onnx") and node.op_type in SAME_TYPE_AS_FIRST_INPUT:
            value = node.inputs[0]
        elif node.op_type in OPS and (node.domain == DOMAIN or (node.domain == MS_DOMAIN
                                                                and node.op_type in MS_DOMAIN_OPS)):
            op = OPS[node.op_type]
            port = op.outputs[value.index()]
            if port.type != "T":
                return port.type
            value = next((v for p, v in zip(op.inputs, node.inputs) if p.type == "T" and v is not None), None)
        else:
            return None
    return None
