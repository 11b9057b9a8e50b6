"""Memory safety of the native library under AddressSanitizer.

Builds a second copy of the library with -fsanitize=address (build/asan/), then runs, in a child Python with
libasan preloaded, every malformed-offset case (negative, decreasing, past the end, wrong length, cu[0] != 0,
last offset != T) and every shape rejection of the state ops, PagedAttention's malformed metadata (block table
entries outside the pool, positions past the table, offsets past the end, negative past lengths), plus valid
calls that exercise the edges of each engine (ragged with zero-length rows, capture, chunk tails, wide and
deep convs, aliased state, pools in every element type). Any out-of-bounds access aborts the child with an
ASan report; a rejection must come back as an ORT error. Exit status 0 means clean.

Usage: python scripts/asan_check.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ASAN_LIBRARY = ROOT / "build" / "asan" / "libonnx_hybrid_ortops.so"


def build_config():
    spec = importlib.util.spec_from_file_location("build_config", ROOT / "onnx_hybrid/ops/native/build_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_asan_library() -> pathlib.Path:
    config = build_config()
    ASAN_LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    flags = [f for f in config.COMPILE_ARGS if f not in ("-O2", "-g0")]
    command = (["g++", *flags, "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-shared"]
               + [f"-I{d}" for d in config.include_dirs()] + [str(s) for s in config.sources()]
               + config.LINK_ARGS + ["-o", str(ASAN_LIBRARY)])
    subprocess.run(command, check=True, cwd=ROOT)
    return ASAN_LIBRARY


CHILD = r'''
import os
import sys
import numpy as np
import onnxruntime
onnxruntime.set_default_logger_severity(4)  # the rejections are expected: log only fatal errors
sys.path.insert(0, "tests")
from onnx_hybrid.ops import library
from onnx_hybrid.ops.single_op import run_single_op, single_op_model, make_session, run_session
from onnx_hybrid.ops.testing import random_conv_case, random_gdn_case, random_paged_attention_case
import test_native_errors as errors

QUICK = sys.argv[1] == "quick"
assert library.library_path() == os.path.realpath(os.environ["ONNX_HYBRID_LIBRARY"]), library.library_path()
rejected = ran = 0

def reject(op, feeds, attrs):
    global rejected
    try:
        run_single_op(op, feeds, attrs, validate=False)
    except Exception as e:
        assert op in str(e), str(e)
        rejected += 1
        return
    raise AssertionError(f"{op}: expected a rejection")

def run(op, case):
    global ran
    run_single_op(op, case.feeds, case.attributes)
    ran += 1

gdn = random_gdn_case(np.random.default_rng(0), [3, 2, 3])
conv = random_conv_case(np.random.default_rng(0), [3, 2, 3])
bad_offsets = [[0, -1, 5, 8], [0, 6, 3, 8], [0, 9, 5, 8], [1, 3, 5, 8], [0, 3, 5, 7], [0, 3, 5, 100],
               [-5, 3, 5, 8], [0, 2**31 - 1, 5, 8], [0, 3, 5, -2**31],
               [0, 3, 8], [0, 3, 5, 6, 8]]  # the last two: wrong length against three-row states
for cu in bad_offsets:
    cu = np.array(cu, np.int32)
    reject("GatedDeltaNet", dict(gdn.feeds, cu_seqlens=cu), gdn.attributes)
    reject("VarlenCausalConvWithState", dict(conv.feeds, cumulative_sequence_length=cu), conv.attributes)
if not QUICK:
    for cases in (errors.GDN_CASES, errors.CONV_CASES):
        for key, (feeds, attrs) in cases.items():
            reject("GatedDeltaNet" if cases is errors.GDN_CASES else "VarlenCausalConvWithState", feeds, attrs)

paged = random_paged_attention_case(np.random.default_rng(0), [3, 2, 3], [20, 0, 31], spare_blocks=0)
blocks, columns = paged.feeds["key_cache"].shape[0], paged.feeds["block_table"].shape[1]
bad_paged = [dict(block_table=np.full_like(paged.feeds["block_table"], v)) for v in (-1, blocks, 2**31 - 1, -2**31)]
bad_paged += [dict(block_table=paged.feeds["block_table"][:, :1]),  # positions past the table
              dict(past_sequence_lengths=np.array([20, 0, 16 * columns], np.int32)),
              dict(past_sequence_lengths=np.array([20, -1, 31], np.int32)),
              dict(past_sequence_lengths=np.array([20, 0, 2**31 - 2], np.int32)),
              dict(block_table=paged.feeds["block_table"][:2])]  # wrong batch
bad_paged += [dict(cumulative_sequence_lengths=np.array(cu, np.int32)) for cu in bad_offsets]
for change in bad_paged:
    reject("PagedAttention", dict(paged.feeds, **change), paged.attributes)

valid_gdn = [dict(lengths=[1, 0, 70, 33], capacity=4, capture=[1, 0, 4, 9]),
             dict(lengths=[65, 130], chunk_size=32, head_size_k=128, head_size_v=24),
             dict(lengths=[40, 3], layout="packed"),
             dict(lengths=[6, 40], per_key_decay=True, head_size_k=33, head_size_v=7),
             dict(lengths=[3, 40], head_size_k=0, head_size_v=4, qk_l2_norm=0, capacity=2, capture=[2, 2]),
             dict(lengths=[3, 40], head_size_k=4, head_size_v=0, capacity=2, capture=[2, 2])]
valid_conv = [dict(lengths=[10, 0, 1, 8], capacity=8, capture=[9, 1, 1, 3]),
              dict(lengths=[7, 9], channels=513), dict(lengths=[20, 3], channels=225, kernel_size=50),
              dict(lengths=[400, 2], channels=33, kernel_size=386, dilation=1),
              dict(lengths=[3, 4], channels=5, kernel_size=1, capacity=2, capture=[2, 2])]
if QUICK:
    valid_gdn, valid_conv = valid_gdn[:2], valid_conv[:2]
for kw in valid_gdn:
    kw = dict(kw); run("GatedDeltaNet", random_gdn_case(np.random.default_rng(1), kw.pop("lengths"), **kw))
for kw in valid_conv:
    kw = dict(kw); run("VarlenCausalConvWithState", random_conv_case(np.random.default_rng(1), kw.pop("lengths"), **kw))
valid_paged = [dict(lengths=[1, 0, 40, 16], past=[15, 9, 0, 16], spare_blocks=0, spare_columns=0),
               dict(lengths=[5, 1], past=[27, 63], dtype="float16", head_size=17, block_size=32),
               dict(lengths=[2, 3], past=[0, 14], dtype="bfloat16", num_heads=8, kv_num_heads=1)]
for kw in valid_paged[:1] if QUICK else valid_paged:
    kw = dict(kw)
    run("PagedAttention", random_paged_attention_case(np.random.default_rng(1), kw.pop("lengths"), kw.pop("past"), **kw))
print(f"asan_check: {rejected} rejections, {ran} valid calls, no memory errors")
'''


def run_child(library: pathlib.Path, quick: bool) -> subprocess.CompletedProcess:
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    libstdcxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                               check=True).stdout.strip()
    # libstdc++ must be loaded when ASan starts, or its __cxa_throw interceptor finds nothing to wrap
    # (python itself does not link libstdc++).
    env = {**os.environ, "LD_PRELOAD": f"{libasan} {libstdcxx}", "ONNX_HYBRID_LIBRARY": str(library),
           # CPython and ORT keep allocations alive until exit: leaks are not what this checks.
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", CHILD, "quick" if quick else "full"], env=env, cwd=ROOT,
                          capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="offsets and a few valid calls only")
    args = parser.parse_args()
    result = run_child(build_asan_library(), args.quick)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-20000:])
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
