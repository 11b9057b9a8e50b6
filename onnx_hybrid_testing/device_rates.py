"""The GPU's name and device-to-device copy rate, the reference the benchmarks state their bytes-per-second
against. CuPy only (the `gpu` extra), so any GPU benchmark can take them without torch."""

from __future__ import annotations

import statistics


def copy_rate() -> float:
    """Device-to-device copy rate of the current device in bytes (read + written) per second: the median of 10
    timed copies of 1 GiB (cudaMemcpyAsync on the current stream) after 3 untimed ones."""
    import cupy

    a = cupy.empty(1 << 30, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    for _ in range(3):
        b.data.copy_from_device_async(a.data, a.nbytes)
    times = []
    for _ in range(10):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        b.data.copy_from_device_async(a.data, a.nbytes)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * a.nbytes / statistics.median(times)


def device_name() -> str:
    """The current CUDA device's name, as the driver reports it."""
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
