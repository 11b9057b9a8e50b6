"""The paged export (`export-hybrid --paged`): graph I/O and config as onnxruntime-genai 0.18's Engine
expects them, validity, and numerics on CPU.

Stock ONNX Runtime has ``com.microsoft::PagedAttention`` only on CUDA, so on CPU:

* an ORT session with our library fails exactly at the missing PagedAttention kernel; with each
  PagedAttention node replaced by a stand-in of the same I/O, every other kernel loads and runs;
* the graph's numerics are checked with ONNX's reference evaluator, running our float64 operator
  references and a NumPy PagedAttention with the semantics of speculative.md §4.2, against transformers
  on two packed requests of different lengths (prefill, then one decode step on the updated pool);
* onnxruntime-genai 0.18's Engine runs the export on CPU (our library for GDN/conv, PagedAttention
  replaced by standard ops from ``onnx_hybrid.testing.paged_attention``): concurrent greedy requests
  equal transformers, external drafts end in partial accepts replayed from our capsules with the same
  tokens, and zeroed capsules (negative control) make the output diverge.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")
ort = pytest.importorskip("onnxruntime")

from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx.reference.op_run import OpRun  # noqa: E402

from onnx_hybrid.cli import export_main  # noqa: E402
from onnx_hybrid.configs import validate  # noqa: E402
from onnx_hybrid.exporter import ExportError, export  # noqa: E402
from onnx_hybrid.ops import contract, reference  # noqa: E402
from onnx_hybrid.testing.checkpoints import LAYOUTS, load_reference, make_tiny_checkpoint  # noqa: E402

BLOCK_SIZE, NUM_BLOCKS, CAPACITY = 16, 4, 3
PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8, 21, 40, 77, 90, 13, 101], [44, 3, 150, 12, 9]]
NEXT = [61, 19]  # one decode token per request
BLOCK_TABLE = np.array([[3, 1], [0, 2]], dtype=np.int32)  # a non-identity block mapping; request 0 spans two
# HF is fp32, the PagedAttention pool fp16: 1e-2 absolute on logits of magnitude ~5 covers the pool's
# rounding (measured max ~2e-3) with margin, and is far below a convention error (O(1)).
LOGITS_TOL = 1e-2


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {layout: make_tiny_checkpoint(root / layout, layout, seed=5) for layout in LAYOUTS}


@pytest.fixture(scope="module")
def paged_export(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("paged") / "out"
    return export(checkpoints["qwen3_5_text"], out, state_update_capacity=CAPACITY, paged=True,
                  block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, progress=False)


def read_config(out):
    return json.loads((out / "genai_config.json").read_text())


# --- config and validity ------------------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("capacity", [0, CAPACITY])
def test_paged_exports_validate_check_and_parse_in_og(layout, capacity, checkpoints, tmp_path):
    out = export(checkpoints[layout], tmp_path / "out", state_update_capacity=capacity, paged=True,
                 block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, progress=False)
    report = validate(out)
    assert report.ok and not report.warnings, report.format()
    onnx.checker.check_model(str(out / "model.onnx"))
    og.Config(str(out))
    decoder = read_config(out)["model"]["decoder"]
    kinds = [g["kind"] for g in decoder["state_groups"]]
    assert kinds == ["paged_kv", "fixed_conv", "fixed_recurrent"]
    assert all(("state_update" in g) == bool(capacity) for g in decoder["state_groups"][1:])
    assert "attention_mask" not in decoder["inputs"]
    assert read_config(out)["engine"] == {"dynamic_batching": {"block_size": BLOCK_SIZE, "num_blocks": NUM_BLOCKS}}


@pytest.mark.parametrize("dtype, pool", [("fp16", "FLOAT16"), ("bf16", "BFLOAT16")])
def test_half_precision_paged_exports_keep_the_pool_in_their_type(dtype, pool, checkpoints, tmp_path):
    out = export(checkpoints["qwen3_5_moe_text"], tmp_path / "out", dtype=dtype, state_update_capacity=2, paged=True,
                 block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, op_domain=contract.MS_DOMAIN, progress=False)
    assert validate(out).ok
    onnx.checker.check_model(str(out / "model.onnx"))
    og.Config(str(out))
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    types = {v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type) for v in graph.input}
    assert types["past_key_values.2.key"] == types["past.0.conv"] == pool
    assert types["past.0.recurrent"] == "FLOAT"
    [attention] = [n for n in graph.node if n.op_type == "PagedAttention"]
    producers = {o: n.op_type for n in graph.node for o in n.output}
    assert producers[attention.input[0]] == "Reshape"  # no Cast: q/k/v are already in the pool's type


def test_paged_io_is_what_the_engine_feeds(paged_export):
    graph = onnx.load(str(paged_export / "model.onnx"), load_external_data=False).graph

    def io(values):
        return {v.name: (onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type),
                         [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values}

    inputs, outputs = io(graph.input), io(graph.output)
    assert inputs["input_ids"] == ("INT64", ["num_tokens"])
    assert inputs["cumulative_sequence_lengths"] == ("INT32", ["batch_size_plus_1"])
    assert inputs["past_sequence_lengths"] == ("INT32", ["batch_size"])
    assert inputs["block_table"] == ("INT32", ["batch_size", "max_num_blocks"])
    assert inputs["attention_metadata"] == ("INT32", [3])
    assert inputs["past_key_values.2.key"] == ("FLOAT16", ["num_blocks", BLOCK_SIZE, 2, 32])
    assert outputs["present.2.value"] == inputs["past_key_values.2.value"]
    assert outputs["logits"] == ("FLOAT", ["num_tokens", 160])
    assert outputs["state_update.0.recurrent_capsule"] == ("FLOAT", ["batch_size", contract.gdn_capsule_width(
        CAPACITY, 4, 2, 16, 32)])
    attention = [n for n in graph.node if n.op_type == "PagedAttention"]
    assert [n.domain for n in attention] == ["com.microsoft"]
    assert attention[0].output[1:] == ["present.2.key", "present.2.value"]  # the pool, updated in place


def test_paged_bindings_form_and_cli_options(checkpoints, tmp_path):
    out = tmp_path / "out"
    assert export_main([str(checkpoints["qwen3_5_text"]), "-o", str(out), "--paged", "--block-size", "32",
                        "--num-blocks", "8", "--state-update-capacity", "2", "--manifest-format", "bindings",
                        "--op-domain", "com.microsoft", "-q"]) == 0
    report = validate(out)
    assert report.ok and report.form == "bindings", report.format()
    groups = read_config(out)["model"]["decoder"]["state_groups"]
    assert groups[0] == {"kind": "paged_kv", "layer_ids": [2], "bindings": {
        "key": {"input": "past_key_values.%d.key", "output": "present.%d.key"},
        "value": {"input": "past_key_values.%d.value", "output": "present.%d.value"}}}
    assert read_config(out)["engine"]["dynamic_batching"]["block_size"] == 32


def test_paged_io_matches_the_0_18_builders_paged_export(checkpoints, tmp_path):
    """onnxruntime-genai's own builder, fp16 CUDA paged export with capacity 3 (it builds the graph on any
    machine): our validator accepts it, and our paged export of the same checkpoint declares the same
    tensors with the same types and ranks (except position_ids: the builder's MRoPE [3, num_tokens], our
    text positions [num_tokens]; the Engine takes both) and the same state_groups."""
    import subprocess
    import sys

    builder = tmp_path / "builder"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoints["qwen3_5_multimodal"]),
                    "-o", str(builder), "-p", "fp16", "-e", "cuda", "-c", str(tmp_path / "cache"), "--extra_options",
                    "use_paged_attention=true", f"state_update_capacity={CAPACITY}", f"num_blocks={NUM_BLOCKS}",
                    f"paged_block_size={BLOCK_SIZE}"], check=True, capture_output=True)
    assert validate(builder).ok, validate(builder).format()
    ours = export(checkpoints["qwen3_5_multimodal"], tmp_path / "ours", dtype="fp16", state_update_capacity=CAPACITY,
                  paged=True, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, op_domain=contract.MS_DOMAIN, progress=False)

    def signature(out):
        graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
        return {v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
                for v in list(graph.input) + list(graph.output) if v.name != "position_ids"}

    assert signature(ours) == signature(builder)
    theirs, mine = read_config(builder)["model"]["decoder"], read_config(ours)["model"]["decoder"]
    assert mine["state_groups"] == theirs["state_groups"]
    assert mine["inputs"] == theirs["inputs"]
    assert mine["outputs"] == theirs["outputs"]


@pytest.mark.parametrize("options, message", [
    (dict(block_size=24), "power of two"), (dict(block_size=8), "power of two"), (dict(num_blocks=0), "positive")])
def test_bad_paged_options(options, message, checkpoints, tmp_path):
    with pytest.raises(ExportError, match=message):
        export(checkpoints["qwen3_5_text"], tmp_path / "out", paged=True, progress=False, **options)


# --- running the graph --------------------------------------------------------------------------


def packed_feeds(graph: onnx.GraphProto, steps: list[list[int]], past: list[int], state: dict | None) -> dict:
    """Feeds for one Engine step: ``steps[b]`` new tokens of request b after ``past[b]`` cached ones."""
    lengths = [len(s) for s in steps]
    feeds = {
        "input_ids": np.array(sum(steps, []), dtype=np.int64),
        "position_ids": np.concatenate([np.arange(p, p + n) for p, n in zip(past, lengths)]).astype(np.int64),
        "cumulative_sequence_lengths": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        "past_sequence_lengths": np.array(past, dtype=np.int32),
        "block_table": BLOCK_TABLE,
        "attention_metadata": np.array([max(lengths), max(p + n for p, n in zip(past, lengths)), 0], np.int32),
        "state_update_capture_count": np.array(lengths, dtype=np.int32),
        "state_update_active": np.array([1], dtype=np.int32),
    }
    for value in graph.input:
        if value.name in feeds:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name.startswith("past_key_values."):
            dims[0] = NUM_BLOCKS
        else:  # conv / recurrent state: one row per request
            dims[0] = len(steps)
        past_name = value.name
        present = past_name.replace("past_key_values.", "present.").replace("past.", "present.")
        feeds[value.name] = state[present] if state else np.zeros(dims, dtype)
    return feeds


def _contract_op(spec: contract.OpSpec, run):
    def _run(self, *inputs, **attributes):
        feeds = {port.name: x for port, x in zip(spec.inputs, inputs) if x is not None}
        output, final_state, update = run(feeds, **attributes)
        state_type = inputs[spec.input("initial_state").index].dtype
        update_type = np.float32 if spec is contract.GATED_DELTA_NET else inputs[0].dtype
        return output.astype(inputs[0].dtype), final_state.astype(state_type), update.astype(update_type)

    return type(spec.name, (OpRun,), {"op_domain": contract.DOMAIN, "_run": _run})


class PagedAttention(OpRun):
    """NumPy PagedAttention (speculative.md §4.2): write each token's K/V into its pool slot, then attend
    causally over the request's positions 0..pos with GQA and ``scale``."""

    op_domain = contract.MS_DOMAIN

    def _run(self, q, k, v, key_cache, value_cache, cu, past, block_table, *unused, num_heads=None,
             kv_num_heads=None, scale=None):
        key_cache, value_cache = key_cache.copy(), value_cache.copy()
        block, d = key_cache.shape[1], key_cache.shape[3]
        n = q.shape[0]
        q = q.reshape(n, num_heads, d).astype(np.float64)
        k, v = k.reshape(n, kv_num_heads, d), v.reshape(n, kv_num_heads, d)
        out = np.zeros((n, num_heads, d))
        slot = lambda b, pos: (block_table[b, pos // block], pos % block)  # noqa: E731
        for b in range(len(cu) - 1):
            for j in range(cu[b], cu[b + 1]):
                key_cache[slot(b, past[b] + j - cu[b])] = k[j]
                value_cache[slot(b, past[b] + j - cu[b])] = v[j]
            for j in range(cu[b], cu[b + 1]):
                positions = range(past[b] + j - cu[b] + 1)
                keys = np.stack([key_cache[slot(b, p)] for p in positions]).astype(np.float64)  # [L, Hkv, D]
                values = np.stack([value_cache[slot(b, p)] for p in positions]).astype(np.float64)
                for h in range(num_heads):
                    g = h // (num_heads // kv_num_heads)
                    scores = keys[:, g] @ q[j, h] * scale
                    probs = np.exp(scores - scores.max())
                    out[j, h] = (probs / probs.sum()) @ values[:, g]
        return out.reshape(n, -1).astype(key_cache.dtype), key_cache, value_cache


REFERENCE_OPS = [_contract_op(contract.GATED_DELTA_NET, reference.gated_delta_net),
                 _contract_op(contract.VARLEN_CAUSAL_CONV, reference.varlen_causal_conv), PagedAttention]


def run_reference(model: onnx.ModelProto, feeds: dict) -> dict:
    evaluator = ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, evaluator.run(None, feeds)))


def test_paged_graph_matches_transformers(paged_export, checkpoints):
    model = onnx.load(str(paged_export / "model.onnx"))
    prefill = run_reference(model, packed_feeds(model.graph, PROMPTS, [0, 0], None))
    decode = run_reference(model, packed_feeds(model.graph, [[t] for t in NEXT], [len(p) for p in PROMPTS], prefill))

    hf = load_reference(checkpoints["qwen3_5_text"])
    offsets = np.cumsum([0] + [len(p) for p in PROMPTS])
    worst = 0.0
    for b, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = hf(torch.tensor([prompt + [NEXT[b]]])).logits[0].numpy()
        got = np.concatenate([prefill["logits"][offsets[b]:offsets[b + 1]], decode["logits"][b:b + 1]])
        worst = max(worst, float(np.abs(got - expected).max()))
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    assert worst < LOGITS_TOL, worst


def test_cpu_session_fails_exactly_at_paged_attention(paged_export, tmp_path):
    from onnx_hybrid.ops import library

    options = ort.SessionOptions()
    options.register_custom_ops_library(library.library_path())
    with pytest.raises(Exception, match=r"Could not find an implementation for PagedAttention\(1\) node with name "
                                        r"'/model/layers.2/attn/PagedAttention'"):
        ort.InferenceSession(str(paged_export / "model.onnx"), options, providers=["CPUExecutionProvider"])

    # The same graph with PagedAttention swapped for a stand-in of the same I/O loads, and runs packed ragged
    # requests through our CPU kernels. Layers 0-1 (GDN) precede the first attention layer, so their states
    # must match the reference evaluator's.
    model = onnx.load(str(paged_export / "model.onnx"))
    for node in [n for n in model.graph.node if n.op_type == "PagedAttention"]:
        position = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        stand_ins = [onnx.helper.make_node("Identity", [node.input[i]], [node.output[o]]) for i, o in ((0, 0), (3, 1), (4, 2))]
        for offset, stand_in in enumerate(stand_ins):
            model.graph.node.insert(position + offset, stand_in)
    onnx.save(model, str(tmp_path / "stand_in.onnx"), save_as_external_data=True, location="stand_in.onnx.data")
    session = ort.InferenceSession(str(tmp_path / "stand_in.onnx"), options, providers=["CPUExecutionProvider"])
    feeds = packed_feeds(model.graph, PROMPTS, [0, 0], None)
    results = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    expected = run_reference(onnx.load(str(paged_export / "model.onnx")), feeds)
    for name in ("present.0.conv", "present.0.recurrent", "present.1.conv", "present.1.recurrent",
                 "state_update.1.conv_value", "state_update.1.recurrent_capsule"):
        np.testing.assert_allclose(results[name], expected[name], atol=1e-4, rtol=1e-4, err_msg=name)
    assert results["logits"].shape == (sum(map(len, PROMPTS)), 160)


# --- onnxruntime-genai's Engine on CPU (PagedAttention as standard ops) -----------------------------

ENGINE_PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150], [44, 3, 150, 12, 9]]
ENGINE_TOKENS = 16
NEVER_GENERATED = 159  # eos/pad: the tiny checkpoint's config has no EOS; 159 does not occur in these runs


def engine_package(paged_export, directory, *, zero_capsules: bool = False):
    """The paged export with PagedAttention replaced by standard ops (and, for the negative control, every
    GDN capsule multiplied by 0, which keeps names, types and shapes, so validation still passes)."""
    from onnx_hybrid.testing.paged_attention import replace_paged_attention

    shutil.copytree(paged_export, directory)
    model = onnx.load(str(directory / "model.onnx"))
    assert replace_paged_attention(model) == 1
    if zero_capsules:
        for node in model.graph.node:
            if node.op_type == "GatedDeltaNet":
                capsule = node.output[2]
                node.output[2] = capsule + ".raw"
                model.graph.node.append(onnx.helper.make_node("Mul", [capsule + ".raw", "zero_f32"], [capsule]))
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros([1], np.float32), "zero_f32"))
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    config = read_config(directory)
    config["model"].update(eos_token_id=[NEVER_GENERATED], pad_token_id=NEVER_GENERATED)
    (directory / "genai_config.json").write_text(json.dumps(config))
    assert validate(directory).ok
    return directory


def run_engine(package, drafts_from: list[list[int]] | None = None) -> tuple[list[list[int]], dict]:
    """Both prompts as concurrent greedy requests. With ``drafts_from``, every request that is decoding
    gets the next C tokens of that reference as external drafts, the second one wrong every other round,
    so rounds end in partial accepts that og replays from the captured capsules."""
    engine = og.Engine(og.Model(str(package)))
    capacity = engine.max_draft_tokens_per_proposal()
    assert capacity == CAPACITY
    requests = []
    for prompt in ENGINE_PROMPTS:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(ENGINE_TOKENS)
        request.begin_turn(np.array(prompt, dtype=np.int32), options)
        requests.append(request)
    tokens = [[] for _ in requests]
    events = engine.create_event_buffer(256)
    for step in range(10 * ENGINE_TOKENS):
        if not engine.has_pending_requests():
            break
        engine.run(events)
        for i in range(len(events)):
            event = events[i]
            assert event.error_code == og.EngineErrorCode.NONE, event.error_code
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[next(k for k, r in enumerate(requests) if r == event.request)].append(event.token)
        for k, request in enumerate(requests):
            done = len(tokens[k])
            if drafts_from and done and ENGINE_TOKENS - done > capacity:
                proposal = list(drafts_from[k][done:done + capacity])
                if step % 2:
                    proposal[1] = (proposal[1] + 1) % 160
                request.set_draft_tokens(np.array(proposal, dtype=np.int32))
    return tokens, engine.get_speculative_stats()


@pytest.fixture(scope="module")
def reference_tokens(checkpoints):
    hf = load_reference(checkpoints["qwen3_5_text"])
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=ENGINE_TOKENS, min_new_tokens=ENGINE_TOKENS,
                            do_sample=False)[0, len(p):].tolist() for p in ENGINE_PROMPTS]


def test_engine_greedy_matches_transformers(paged_export, reference_tokens, tmp_path):
    tokens, _ = run_engine(engine_package(paged_export, tmp_path / "pkg"))
    assert tokens == reference_tokens


def test_engine_replays_partial_accepts_from_our_capsules(paged_export, reference_tokens, tmp_path):
    tokens, stats = run_engine(engine_package(paged_export, tmp_path / "pkg"), reference_tokens)
    assert tokens == reference_tokens
    histogram = stats["acceptance_length_histogram"]
    assert stats["partial_accept_rounds"] > 0 and histogram[1] > 0 and histogram[CAPACITY] > 0, stats
    assert stats["target_forward_passes"] < ENGINE_TOKENS


def test_engine_negative_control_zeroed_capsules_diverge(paged_export, reference_tokens, tmp_path):
    tokens, stats = run_engine(engine_package(paged_export, tmp_path / "pkg", zero_capsules=True), reference_tokens)
    assert stats["partial_accept_rounds"] > 0
    assert tokens != reference_tokens
