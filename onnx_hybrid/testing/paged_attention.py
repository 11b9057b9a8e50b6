"""A CPU stand-in for ``com.microsoft::PagedAttention`` built from standard ONNX ops (tests only).

Stock ONNX Runtime has PagedAttention only on CUDA. Replacing each node by this subgraph lets a paged
export run on CPU, under ORT or under onnxruntime-genai's Engine. Semantics (speculative.md §4.2): token
j of the packed batch belongs to request b with ``cu[b] <= j < cu[b+1]`` and sits at position
``past[b] + j - cu[b]``; its key/value go to slot ``block_table[b, pos // bs] * bs + pos % bs`` of the
pool, and it attends causally over positions 0..pos of its request with GQA and ``scale``.

The subgraph gathers every position of the request's block table for every token (O(tokens x
max_blocks x block_size)) and rewrites the whole pool with ScatterND: fine for tiny models, not a kernel.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INT64 = TensorProto.INT64


def replace_paged_attention(model: onnx.ModelProto) -> int:
    """Replace every PagedAttention node of ``model`` in place; returns how many were replaced."""
    graph = model.graph
    cache_shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    replaced = 0
    for index, node in reversed(list(enumerate(graph.node))):
        if node.op_type != "PagedAttention" or node.domain != "com.microsoft":
            continue
        _, block_size, kv_heads, head_size = cache_shapes[node.input[3]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes, constants = _subgraph(node, f"{node.name or 'paged_attention'}/standin/", block_size, kv_heads,
                                     head_size, attrs["num_heads"], attrs.get("scale", head_size ** -0.5))
        del graph.node[index]
        for offset, new in enumerate(nodes):
            graph.node.insert(index + offset, new)
        graph.initializer.extend(constants)
        replaced += 1
    return replaced


def _subgraph(node: onnx.NodeProto, prefix: str, block_size: int, kv_heads: int, head_size: int, num_heads: int,
              scale: float) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    q, k, v, key_cache, value_cache, cu, past, block_table = node.input[:8]
    out, key_out, value_out = node.output
    nodes: list[onnx.NodeProto] = []
    constants: list[onnx.TensorProto] = []

    def const(name: str, values, dtype=np.int64) -> str:
        constants.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), prefix + name))
        return prefix + name

    def op(op_type: str, inputs: list[str], name: str, **attributes) -> str:
        nodes.append(helper.make_node(op_type, inputs, [prefix + name], name=prefix + name, **attributes))
        return prefix + name

    groups = num_heads // kv_heads
    bs = const("block_size", block_size)
    cu64, past64, table = (op("Cast", [x], f"{x}_i64", to=INT64) for x in (cu, past, block_table))
    tokens = op("Gather", [op("Shape", [q], "q_shape"), const("zero_index", 0)], "num_tokens", axis=0)
    token = op("Range", [const("zero", 0), tokens, const("one", 1)], "token")  # [N]
    ends = op("Slice", [cu64, const("one_1d", [1]), const("max_1d", [np.iinfo(np.int64).max])], "ends")  # [B]
    after = op("GreaterOrEqual", [op("Unsqueeze", [token, const("axis1", [1])], "token_col"),
                                  op("Unsqueeze", [ends, const("axis0", [0])], "ends_row")], "after")
    request = op("ReduceSum", [op("Cast", [after], "after_i64", to=INT64), const("axis1b", [1])], "request",
                 keepdims=0)  # [N]: how many requests end at or before token j
    position = op("Add", [op("Gather", [past64, request], "past_of_token"),
                          op("Sub", [token, op("Gather", [cu64, request], "start_of_token")], "offset")], "position")
    rows = op("Gather", [table, request], "rows", axis=0)  # [N, max_blocks]

    def slot_of(positions: str, blocks: str, name: str) -> str:
        return op("Add", [op("Mul", [blocks, bs], f"{name}_base"), op("Mod", [positions, bs], f"{name}_in_block")],
                  name)

    block = op("Squeeze", [op("GatherElements", [rows, op("Unsqueeze", [op("Div", [position, bs], "block_index"),
                                                                        const("axis1c", [1])], "block_col")],
                              "block_2d", axis=1), const("axis1d", [1])], "block")
    slot = op("Unsqueeze", [slot_of(position, block, "slot"), const("axis1e", [1])], "slot_col")  # [N, 1]

    heads_shape = const("heads_shape", [-1, kv_heads, head_size])
    pools = []
    for cache, new, output in ((key_cache, k, key_out), (value_cache, v, value_out)):
        flat = op("Reshape", [cache, heads_shape], f"{output}_flat")
        updated = op("ScatterND", [flat, slot, op("Reshape", [new, heads_shape], f"{output}_new")],
                     f"{output}_updated")
        nodes.append(helper.make_node("Reshape", [updated, op("Shape", [cache], f"{output}_shape")], [output]))
        pools.append(updated)

    # Every position of the request's blocks; positions after the token's own are masked out.
    span = op("Mul", [op("Gather", [op("Shape", [table], "table_shape"), const("one_index", 1)], "max_blocks"), bs],
              "span")
    positions = op("Range", [const("zero_b", 0), span, const("one_b", 1)], "positions")  # [L]
    blocks = op("Gather", [rows, op("Div", [positions, bs], "position_blocks")], "blocks", axis=1)  # [N, L]
    visible = op("LessOrEqual", [op("Unsqueeze", [positions, const("axis0b", [0])], "positions_row"),
                                 op("Unsqueeze", [position, const("axis1f", [1])], "position_col")], "visible")
    slots = op("Where", [visible, slot_of(positions, blocks, "slots"), const("zero_c", 0)], "visible_slots")

    def gathered(pool: str, name: str) -> str:  # [N, L, Hkv, D] -> fp32
        return op("Cast", [op("Gather", [pool, slots], f"{name}_rows", axis=0)], name, to=TensorProto.FLOAT)

    keys, values = gathered(pools[0], "keys"), gathered(pools[1], "values")
    query = op("Cast", [op("Reshape", [q, const("query_shape", [-1, kv_heads, groups, head_size])], "query_4d")],
               "query", to=TensorProto.FLOAT)  # [N, Hkv, G, D]
    scores = op("Mul", [op("MatMul", [query, op("Transpose", [keys], "keys_t", perm=[0, 2, 3, 1])], "dot"),
                        const("scale", [scale], np.float32)], "scores")  # [N, Hkv, G, L]
    mask = op("Unsqueeze", [visible, const("axes12", [1, 2])], "mask")
    masked = op("Where", [mask, scores, const("neg_inf", [-np.inf], np.float32)], "masked")
    probs = op("Softmax", [masked], "probs", axis=-1)
    context = op("MatMul", [probs, op("Transpose", [values], "values_t", perm=[0, 2, 1, 3])], "context")
    flat_out = op("Reshape", [context, const("out_shape", [0, num_heads * head_size])], "context_flat")
    nodes.append(helper.make_node("CastLike", [flat_out, q], [out]))  # back to q's element type
    return nodes, constants
