"""Replay agreement at model level (issue 7, point 4).

For every tiny layout, the paged export runs a verify step of C + 1 tokens per request with capture. For
every accepted prefix n <= C, replaying each linear layer's conv and recurrent capsules onto the pre-step
states (onnx_hybrid.ops.replay: the CPU rounding of docs/op-contract.md#state-update-rounding, the arithmetic
of onnxruntime-genai's host replay) must equal, bit for bit:

* the ``final_state`` of our op run on just that prefix of the inputs the layer saw in the verify step
  (the contract's definition, docs/op-contract.md#gateddeltanet-replay and #conv-capsule-and-replay), for
  every layout; and
* the ``present.*`` states of a model step over only the n tokens, where every other kernel of the model
  gives a token the same bits whatever the step's token count. That holds for the dense layouts. ORT's
  CPU ``com.microsoft::MoE`` does not: the same token's expert output differs by up to ~7e-7 between a
  10-token and a 2-token call, so for MoE layouts the model-level states agree to 1e-5, not bitwise.

This is what the Engine relies on when it commits a partial accept. Its rebuilt state is not readable
through its API; its tokens are (test_engine_speculative_cpu.py).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("transformers")

from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.exporter import io_names as io  # noqa: E402
from onnx_hybrid.ops import contract, replay  # noqa: E402
from onnx_hybrid_testing.single_op import run_single_op  # noqa: E402
from onnx_hybrid_testing.checkpoints import LAYOUTS, make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.greedy import make_session  # noqa: E402
from onnx_hybrid_testing.packed import packed_feeds  # noqa: E402

CAPACITY = 4
BLOCK_SIZE, NUM_BLOCKS = 16, 6
BLOCK_TABLE = np.array([[4, 1], [0, 5]], dtype=np.int32)
PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8, 21, 40], [44, 3, 150]]  # request 0 crosses a block
VERIFY = [[61, 12, 9, 140, 77], [19, 2, 150, 33, 8]]  # t + C drafts per request
STATE_OPS = {contract.GATED_DELTA_NET.name: contract.GATED_DELTA_NET,
             contract.VARLEN_CAUSAL_CONV.name: contract.VARLEN_CAUSAL_CONV}
TOKEN_MAJOR = {"query", "key", "value", "decay", "beta", "input"}  # inputs with one row per packed token


def expose_state_op_inputs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, dict[str, str]]]:
    """Make every computed input of the state ops a graph output; return (node, {port: tensor name})."""
    graph = model.graph
    declared = {v.name for v in list(graph.input) + list(graph.output)} | {i.name for i in graph.initializer}
    nodes = []
    for node in graph.node:
        if node.domain != contract.DOMAIN or node.op_type not in STATE_OPS:
            continue
        ports = {p.name: name for p, name in zip(STATE_OPS[node.op_type].inputs, node.input) if name}
        for name in ports.values():
            if name not in declared:
                graph.output.append(onnx.ValueInfoProto(name=name))  # ORT infers the type
                declared.add(name)
        nodes.append((node, ports))
    return nodes


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_capsule_replay_equals_a_run_over_the_accepted_prefix(layout, tmp_path):
    checkpoint = make_tiny_checkpoint(tmp_path / "checkpoint", layout, seed=11)
    out = export(checkpoint, tmp_path / "out", state_update_capacity=CAPACITY, paged=True, block_size=BLOCK_SIZE,
                 num_blocks=NUM_BLOCKS, progress=False)
    model = onnx.load(str(out / "model.onnx"))
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    state_ops = expose_state_op_inputs(model)
    probe = tmp_path / "probe"
    probe.mkdir()
    onnx.save(model, str(probe / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    session = make_session(probe, contract.DOMAIN)
    names = [o.name for o in session.get_outputs()]

    def step(tokens, past, state, capture):
        feeds = packed_feeds(model.graph, tokens, past, state, block_table=BLOCK_TABLE, num_blocks=NUM_BLOCKS,
                             capture=capture)
        return feeds, dict(zip(names, session.run(None, feeds)))

    _, committed = step(PROMPTS, [0, 0], None, [0, 0])
    past = [len(p) for p in PROMPTS]
    verify_feeds, verify = step(VERIFY, past, committed, [CAPACITY] * len(VERIFY))
    groups = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["state_groups"]
    [layers] = [g["layer_ids"] for g in groups if g["kind"] == "fixed_recurrent"]
    moe = any(node.op_type == "MoE" for node in model.graph.node)
    starts = np.cumsum([0] + [len(v) for v in VERIFY])

    for n in range(1, CAPACITY + 1):
        replayed = {}
        for i in layers:
            replayed[io.PRESENT_CONV % i] = replay.replay_conv(
                committed[io.PRESENT_CONV % i].copy(), verify[io.STATE_UPDATE_CONV_VALUE % i], n)
            replayed[io.PRESENT_RECURRENT % i] = replay.replay_gdn(
                committed[io.PRESENT_RECURRENT % i].copy(), verify[io.STATE_UPDATE_RECURRENT_CAPSULE % i], n, CAPACITY)

        # Our ops on the first n tokens of what each layer saw in the verify step.
        rows = np.concatenate([np.arange(s, s + n) for s in starts[:-1]])
        for node, ports in state_ops:
            op = STATE_OPS[node.op_type]
            feeds = {}
            for port, name in ports.items():
                value = verify.get(name, verify_feeds.get(name, initializers.get(name)))
                feeds[port] = value[rows] if port in TOKEN_MAJOR else value
            offsets = np.arange(len(VERIFY) + 1, dtype=np.int32) * n
            feeds["cu_seqlens" if op is contract.GATED_DELTA_NET else "cumulative_sequence_length"] = offsets
            feeds["capture_count"] = np.zeros(len(VERIFY), np.int32)
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            final = run_single_op(op.name, feeds, attributes)["final_state"]
            np.testing.assert_array_equal(replayed[node.output[1]], final, err_msg=f"{node.name}, n={n}")

        # The whole model over just the n tokens.
        _, prefix = step([tokens[:n] for tokens in VERIFY], past, committed, [0] * len(VERIFY))
        for name, state in replayed.items():
            if moe:
                np.testing.assert_allclose(state, prefix[name], rtol=1e-5, atol=1e-5, err_msg=f"{name}, n={n}")
            else:
                np.testing.assert_array_equal(state, prefix[name], err_msg=f"{name}, n={n}")
        if not moe:  # the accepted rows' logits do not depend on the drafts after them
            np.testing.assert_array_equal(verify[io.LOGITS][rows], prefix[io.LOGITS])
