"""Child process of cuda_stub.planned_launches: onnx_hybrid.cuda_ops calls on fake device addresses, launched
through the library into the stand-in libcuda, which prints the launches. Prints "call N" before each call, and
"error TypeName | message" when a call raises, "workspace N" for a gdn_workspace call.

    python cuda_stub_child.py CALLS_JSON ARCH [IMAGE]

A call is a dict with "op":
  gdn, gdn_workspace: dtype, batch, tokens, hk, hv, dk, dv; optional per_key, capacity, knobs (engine, rec_rows,
      rec_groups, scan_width, prep_heads), shift (input or output name -> bytes added to its address),
      short_output (the given output one token short)
  gdn_bound, conv_bound: as gdn / conv, bound (bind_*) and then launched "launches" times; gdn_bound binds without
      a workspace unless "workspace" is true
  conv: dtype, batch, tokens, channels; optional kernel_size (4), capacity, state_offset (final_state's address
      minus initial_state's: 0 is in place; default far apart)
  replay_gdn: batch, hk, hv, dk, dv, capacity;  replay_conv: dtype, batch, channels, state_len, capacity
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnx_hybrid.cuda_ops import api  # noqa: E402
from onnx_hybrid.cuda_ops.tensors import DeviceTensor  # noqa: E402
from onnx_hybrid.ops import contract, library  # noqa: E402

_next_address = [1 << 32]


def fake(shape, dtype, shift=0):
    """A device array no one reads (the stub never touches memory), 1 GB apart from the others."""
    _next_address[0] += 1 << 30
    return DeviceTensor(_next_address[0] + shift, tuple(int(d) for d in shape), dtype, 0, None)


def gdn_arrays(c):
    b, t, hk, hv, dk, dv = (c[k] for k in ("batch", "tokens", "hk", "hv", "dk", "dv"))
    dtype, shift, capacity = c["dtype"], c.get("shift", {}), c.get("capacity", 0)
    shapes = {"query": ((t, hk, dk), dtype), "key": ((t, hk, dk), dtype), "value": ((t, hv, dv), dtype),
              "cu_seqlens": ((b + 1,), "int32"), "decay": ((t, hv, dk) if c.get("per_key") else (t, hv), "float32"),
              "beta": ((t, hv), "float32"), "initial_state": ((b, hv, dv, dk), "float32")}
    attrs = dict(update_rule="gated_delta", beta_activation="sigmoid", qk_l2_norm=1, state_update_capacity=capacity,
                 gate_activation="none" if c.get("per_key") else "qwen")  # Qwen3.5's gate, or raw per-key decay
    if not c.get("per_key"):
        shapes.update(a_log=((hv,), "float32"), dt_bias=((hv,), "float32"))
    if capacity:
        shapes["capture_count"] = ((b,), "int32")
    feeds = {name: fake(shape, dt, shift.get(name, 0)) for name, (shape, dt) in shapes.items()}
    rows = t - 1 if c.get("short_output") else t
    outputs = {"output": fake((rows, hv, dv), dtype, shift.get("output", 0)),
               "final_state": fake((b, hv, dv, dk), "float32", shift.get("final_state", 0)),
               "state_update": fake((b, contract.gdn_capsule_width(capacity, hv, hk, dk, dv)), "float32")}
    return feeds, outputs, attrs


def run(c):
    op = c["op"]
    if op == "gdn_bound":
        feeds, outputs, attrs = gdn_arrays(c)
        workspace = fake((1 << 28,), "int32") if c.get("workspace") else None
        bound = api.bind_gated_delta_net(feeds, outputs=outputs, stream=0x10, workspace=workspace, **attrs)
        for _ in range(c["launches"]):
            bound()
    elif op == "conv_bound":
        b, t, ch, dtype = c["batch"], c["tokens"], c["channels"], c["dtype"]
        feeds = {"input": fake((t, ch), dtype), "weight": fake((ch, 1, 4), dtype), "bias": fake((ch,), dtype),
                 "initial_state": fake((b, ch, 3), dtype), "cumulative_sequence_length": fake((b + 1,), "int32")}
        outputs = {"output": fake((t, ch), dtype), "final_state": fake((b, ch, 3), dtype),
                   "state_update": fake((b, 0, ch), dtype)}
        bound = api.bind_varlen_causal_conv(feeds, outputs=outputs, stream=0x10)
        for _ in range(c["launches"]):
            bound()
    elif op in ("gdn", "gdn_workspace"):
        feeds, outputs, attrs = gdn_arrays(c)
        knobs = c.get("knobs", {})
        if op == "gdn_workspace":
            print("workspace", api.gdn_workspace_bytes(feeds, outputs=outputs, stream=0x10, **knobs, **attrs))
        else:
            api.gated_delta_net(feeds, outputs=outputs, stream=0x10, workspace=fake((1 << 28,), "int32"), **knobs,
                                **attrs)
    elif op == "conv":
        b, t, ch, k, dtype = c["batch"], c["tokens"], c["channels"], c.get("kernel_size", 4), c["dtype"]
        capacity = c.get("capacity", 0)
        feeds = {"input": fake((t, ch), dtype), "weight": fake((ch, 1, k), dtype), "bias": fake((ch,), dtype),
                 "initial_state": fake((b, ch, k - 1), dtype), "cumulative_sequence_length": fake((b + 1,), "int32")}
        if capacity:
            feeds["capture_count"] = fake((b,), "int32")
        state_in = feeds["initial_state"]
        state = (fake(state_in.shape, dtype) if "state_offset" not in c else
                 DeviceTensor(state_in.ptr + c["state_offset"], state_in.shape, dtype, 0, None))
        outputs = {"output": fake((t, ch), dtype), "final_state": state,
                   "state_update": fake((b, capacity, ch), dtype)}
        api.varlen_causal_conv(feeds, outputs=outputs, stream=0x10, state_update_capacity=capacity)
    elif op == "replay_gdn":
        b, hk, hv, dk, dv, cap = (c[k] for k in ("batch", "hk", "hv", "dk", "dv", "capacity"))
        api.replay_gdn(fake((b, hv, dv, dk), "float32"), fake((b, contract.gdn_capsule_width(cap, hv, hk, dk, dv)),
                                                                "float32"), fake((b,), "int32"), cap, stream=0x10)
    elif op == "replay_conv":
        b, ch, sl, cap, dtype = (c[k] for k in ("batch", "channels", "state_len", "capacity", "dtype"))
        api.replay_conv(fake((b, ch, sl), dtype), fake((b, cap, ch), dtype), fake((b,), "int32"), stream=0x10)
    else:
        raise SystemExit(f"unknown op {op!r}")


def main():
    calls, arch = json.loads(sys.argv[1]), int(sys.argv[2])
    library.set_cuda_image(arch, Path(sys.argv[3]).read_bytes() if len(sys.argv) > 3 else f"sm{arch}\0".encode())
    api._prepared.add(0)
    for i, c in enumerate(calls):
        print("call", i, flush=True)
        try:
            run(c)
        except Exception as e:  # the test reads the error's type and message
            print("error", type(e).__name__, "|", e, flush=True)


if __name__ == "__main__":
    main()
