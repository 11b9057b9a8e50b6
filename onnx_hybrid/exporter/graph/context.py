"""What every layer module needs while it emits nodes: the tape, dtypes, weights and shared tensors.

Activations inside the decoder are token-major 2-D ``[N, H]`` with ``N = batch * sequence``: every
projection is then a ``Gemm(transB=1)`` (or our ``Linear``, the same product) straight on the
checkpoint's ``[out, in]`` weight (no transposed copy at export, and ORT prepacks Gemm's B once), the conv op
takes ``[T, C]`` as is, and GatedDeltaNet takes the conv output ``[N, q | k | v]`` whole, in its packed-QKV form.
Only attention needs ``[B, S, ...]`` views, built from one shared shape tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ...ops import contract
from ..errors import ExportError
from ..model_config import ModelConfig
from ..weights import QuantizedWeight, Segment, Weights
from .quantized import QuantOptions, gather_block_quantized, matmul_nbits

OPSET = 23  # RMSNormalization
FLOAT = ir.DataType.FLOAT
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


@dataclass(frozen=True)
class PackedInputs:
    """Graph inputs of the paged export: requests packed on one token axis
    (docs/genai-config.md#graph-inputs-and-outputs)."""

    input_ids: ir.Value  # int64 [num_tokens]
    position_ids: ir.Value  # int64 [num_tokens]
    cumulative_sequence_lengths: ir.Value  # int32 [B+1]
    past_sequence_lengths: ir.Value  # int32 [B]
    block_table: ir.Value  # int32 [B, max_num_blocks]
    attention_metadata: ir.Value  # int32 [3], host memory

    def values(self) -> list[ir.Value]:
        return [self.input_ids, self.position_ids, self.cumulative_sequence_lengths, self.past_sequence_lengths,
                self.block_table, self.attention_metadata]


@dataclass(frozen=True)
class TokenGrid:
    """The [B, S] token grid of a non-paged step as device tensors (decoder.token_grid)."""

    seq: ir.Value  # int64 [B, 1]: S in every row
    slots: ir.Value  # int64 [B, S]: 0 .. S-1
    ones: ir.Value  # int64 [B, S]


@dataclass(frozen=True)
class RowAlignment:
    """GroupQueryAttention's view of a left-padded step (group_query_attention.py): each row's tokens moved to
    the row's front, and its per-row lengths."""

    to_front: ir.Value  # int64 [N]: Gather indices on the token axis that move each row's padding to its end
    back: ir.Value  # int64 [N]: the inverse permutation
    seqlens_k: ir.Value  # int32 [B]: valid tokens so far - 1
    total_sequence_length: ir.Value  # int32 scalar: the attention_mask's width


@dataclass
class SharedInputs:
    """Tensors computed once in the preamble and read by many layers."""

    batch: ir.Value  # int64 [1]
    seq: ir.Value | None  # int64 [1]; None in the paged graph (no [B, S] grid)
    mask_column: ir.Value | None  # act [N, 1]: 1 for real tokens of this step, 0 for padding; None when packed
    cu_seqlens: ir.Value  # int32 [B+1] = 0, S, 2S, ... (uniform rows), or the packed requests' offsets
    positions: ir.Value | None  # int64 [1, N]: every token's position, in the order the layers see the tokens
    rotary_caches: tuple[ir.Value, ir.Value] | None  # act cos, sin [max positions, R/2] (RotaryEmbedding's)
    attention_bias: ir.Value | None  # act [B, 1, 1, S, L]: 0 where allowed, dtype min elsewhere
    capture_count: ir.Value | None  # int32 [B]
    state_update_active: ir.Value | None  # int32 [1]
    packed: PackedInputs | None = None  # the paged graph's inputs
    rows: RowAlignment | None = None  # shared KV buffers only; then positions are in its front-aligned order


@dataclass
class GraphContext:
    config: ModelConfig
    weights: Weights
    act: ir.DataType  # activation dtype
    np_act: np.dtype
    op_domain: str
    capacity: int
    # Checkpoint prefix of the decoder layers: "mtp.layers." builds the MTP head's layer with the same code.
    layer_prefix: str = "model.layers."
    quant: QuantOptions | None = None  # quantized projections (None: every weight in the activation type)
    kv_cache: str = "concat"  # non-paged KV: "concat" (grows per step) or "shared" (group_query_attention.py)
    # Projections in the activation type as onnx_hybrid::Linear (CUDA: the weights of a decode step read at the
    # copy rate) instead of Gemm(transB=1)
    linear_op: bool = False
    # 4-bit projections as onnx_hybrid::QuantizedLinear instead of com.microsoft::MatMulNBits
    quantized_linear_op: bool = False
    # The GatedDeltaNet output norm as com.microsoft::GatedRMSNorm (CUDA: one launch instead of three; ORT 1.32's CPU
    # kernel is several times slower than the separate nodes, docs/model.md#gated-rmsnorm)
    gated_norm_op: bool = False
    tape: ir.tape.Tape = field(default_factory=ir.tape.Tape)
    shared: SharedInputs | None = None
    _constants: dict = field(default_factory=dict)

    def layer(self, index: int) -> str:
        """Checkpoint name prefix of decoder layer ``index`` (e.g. ``model.layers.3.``)."""
        return f"{self.layer_prefix}{index}."

    def op(self, op_type: str, *inputs, output: ir.Value | None = None, **attributes) -> ir.Value:
        """One node; ``output`` names a pre-made value (a graph output) as its result."""
        return self.tape.op(op_type, list(inputs), attributes or None, output=output)

    def ops(self, op_type: str, *inputs, num_outputs: int, **attributes) -> tuple[ir.Value, ...]:
        return tuple(self.tape.op_multi_out(op_type, list(inputs), attributes or None, num_outputs=num_outputs))

    def add_node(self, node: ir.Node) -> None:
        """A node built elsewhere (the contract's node builders)."""
        self.tape._nodes.append(node)  # noqa: SLF001 - the tape has no public append
        self.tape._used_opsets.add((node.domain, node.version))  # noqa: SLF001

    def const(self, values, dtype=np.int64) -> ir.Value:
        """A small inline constant, shared by value."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = f"const_{len(self._constants)}"
            self._constants[key] = self.tape.initializer(ir.tensor(array, name=name), name=name)
        return self._constants[key]

    def act_const(self, value: float) -> ir.Value:
        return self.const([value], self.np_act)

    # ---- building blocks used by several layer kinds ----

    def projection(self, name: str, segments: list[Segment], shape) -> ir.Value | QuantizedWeight:
        """A linear layer's [out, in] weight from (shape-checked) row segments: block-quantized when the export
        quantizes weights, else in the activation type."""
        if self.quant:
            return self.weights.quantized(name, segments, shape, self.np_act, self.quant.spec)
        return self.weights.rows(name, segments, shape, self.np_act)

    def projection_tensor(self, name: str, source: str, shape) -> ir.Value | QuantizedWeight:
        """:meth:`projection` of one whole checkpoint tensor."""
        self.weights.require(source, shape)
        return self.projection(name, [Segment(source, 0, shape[0])], shape)

    def linear(self, x: ir.Value, weight: ir.Value | QuantizedWeight) -> ir.Value:
        """x [N, in] @ W^T with W stored [out, in] as in the checkpoint (or quantized so)."""
        if self._own_linear(weight):
            return self._linear_node(x, weight, [ir.Value()])[0]
        if isinstance(weight, QuantizedWeight):
            return matmul_nbits(self, x, weight, self.quant.accuracy_level)
        return self.op("Gemm", x, weight, transB=1)

    def linear_parts(self, x: ir.Value, weight: ir.Value | QuantizedWeight, sizes: list[int]) -> tuple[ir.Value, ...]:
        """x @ W^T split into columns of ``sizes``: one Linear with an output per part where the projections are our
        Linear, else the product and a Split."""
        if self._own_linear(weight):
            return tuple(self._linear_node(x, weight, [ir.Value() for _ in sizes], output_features=sizes))
        return self.ops("Split", self.linear(x, weight), self.const(sizes), num_outputs=len(sizes), axis=-1)

    def swiglu_linear(self, x: ir.Value, gate_up: ir.Value | QuantizedWeight, width: int) -> ir.Value:
        """SiLU(x @ G^T) * (x @ U^T) for gate_up = [G; U] ([2 * width, in]): one Linear(activation=swiglu) where the
        projections are our Linear, else the product, a Split, SiLU and Mul."""
        if self._own_linear(gate_up):
            return self._linear_node(x, gate_up, [ir.Value()], activation="swiglu")[0]
        gate, up = self.ops("Split", self.linear(x, gate_up), self.const([width, width]), num_outputs=2, axis=-1)
        return self.op("Mul", self.silu(gate), up)

    def _own_linear(self, weight: ir.Value | QuantizedWeight) -> bool:
        """Whether a projection is our Linear (or, for 4-bit weights, QuantizedLinear) rather than ORT's ops."""
        if isinstance(weight, QuantizedWeight):
            return self.quantized_linear_op and weight.spec.bits == contract.QUANTIZED_LINEAR_BITS
        return self.linear_op

    def _linear_node(self, x: ir.Value, weight: ir.Value | QuantizedWeight, outputs: list[ir.Value],
                     activation: str = "none", output_features: list[int] | None = None) -> list[ir.Value]:
        attributes = {"activation": activation, "output_features": output_features or []}
        if isinstance(weight, QuantizedWeight):
            inputs = {"input": x, "weight": weight.codes, "scales": weight.scales, "zero_points": weight.zero_points}
            attributes["block_size"] = weight.spec.block_size
            attributes["accuracy_level"] = self.quant.accuracy_level
            self.add_node(contract.make_ir_node(contract.QUANTIZED_LINEAR, inputs, outputs, attributes))
        else:
            self.add_node(contract.make_ir_node(contract.LINEAR, {"input": x, "weight": weight}, outputs, attributes))
        return outputs

    def embed(self, token_ids: ir.Value) -> ir.Value:
        """Rows of the embedding table for flat ``token_ids`` [N]: [N, H]."""
        cfg, source = self.config, EMBEDDING
        shape = [cfg.vocab_size, cfg.hidden_size]
        if self.quant and self.quant.embedding:
            spec = self.quant.spec
            if cfg.hidden_size % spec.block_size:
                raise ExportError(f"quantized embedding: hidden_size {cfg.hidden_size} is not a multiple of the "
                                  f"weight block size {spec.block_size} (GatherBlockQuantized needs whole blocks)")
            self.weights.require(source, shape)
            table = self.weights.quantized(source, [Segment(source, 0, cfg.vocab_size)], shape, self.np_act, spec,
                                           "gather")
            return gather_block_quantized(self, table, token_ids)
        return self.op("Gather", self.weights.tensor(source, source, shape, self.np_act), token_ids, axis=0)

    def lm_head(self, hidden: ir.Value) -> ir.Value:
        """Logits [N, V]; a tied head in the activation type reuses the embedding's initializer (one copy)."""
        cfg = self.config
        source = EMBEDDING if cfg.tie_word_embeddings else LM_HEAD
        shape = [cfg.vocab_size, cfg.hidden_size]
        if self.quant and self.quant.lm_head:
            return self.linear(hidden, self.projection_tensor(LM_HEAD, source, shape))
        return self.linear(hidden, self.weights.tensor(source, source, shape, self.np_act))

    def rms_norm(self, x: ir.Value, scale: ir.Value) -> ir.Value:
        """RMSNorm over the last axis, its statistics in fp32 (stash_type 1) whatever the activation type; ``scale``
        is a :meth:`norm_weight`. No Casts around it: ORT's kernels take fp16/bf16 in and out."""
        return self.op("RMSNormalization", x, scale, axis=-1, epsilon=self.config.rms_norm_eps, stash_type=1)

    def add_rms_norm(self, residual: ir.Value, branch: ir.Value | None, scale: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
        """(RMSNorm(residual + branch), residual + branch) as one com.microsoft::SkipSimplifiedLayerNormalization
        (fp32 statistics, on ORT's CPU and CUDA providers): the residual add of a pre-norm block fused into the
        next norm. Without a branch, the plain norm of ``residual``."""
        if branch is None:
            return self.rms_norm(residual, scale), residual
        normed, _mean, _inv_std, total = self.tape.op_multi_out(
            "SkipSimplifiedLayerNormalization", [branch, residual, scale], {"epsilon": self.config.rms_norm_eps},
            domain=contract.MS_DOMAIN, num_outputs=4)
        return normed, total

    def silu(self, x: ir.Value) -> ir.Value:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def norm_weight(self, name: str, source: str, size: int, *, zero_centred: bool = True) -> ir.Value:
        """RMSNorm scale in the activation type (what ORT's norm kernels take with it); zero-centred checkpoint
        weights become 1 + w, computed in fp32 and rounded once (docs/model.md#rmsnorm)."""
        return self.weights.tensor(name, source, [size], self.np_act, add_one=zero_centred)
