"""Device tensors from CuPy arrays, ``__cuda_array_interface__`` or ``__dlpack__`` producers (torch, ...).

Only what the launcher needs is kept: the device pointer, shape, element type and device; the producer
object is held so that the memory stays alive. Contiguous CUDA torch tensors are read directly (the protocols
cost more host time than a decode kernel takes); other producers' bfloat16 arrives through DLPack.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, NamedTuple, Sequence

ELEMENT_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
_CAI_TYPES = {"<f4": "float32", "<f2": "float16", "<i4": "int32"}


class DeviceTensor(NamedTuple):  # a tuple: built on every call of the API, where a frozen dataclass costs ~1 us
    ptr: int
    shape: tuple[int, ...]
    dtype: str
    device: int
    owner: Any

    @property
    def nbytes(self) -> int:
        n = ELEMENT_SIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


# The NamedTuple's generated __new__ is a Python call: building the tuple directly saves ~0.2 us a tensor on the
# paths every API call takes (torch and CuPy arrays).
_tuple_new = tuple.__new__


def _contiguous_strides(shape, itemsize):
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def as_device_tensor(x: Any, name: str) -> DeviceTensor:
    if isinstance(x, DeviceTensor):
        return x
    torch_tensor = _TORCH[0] or _torch_tensor_type()
    if torch_tensor is not None and isinstance(x, torch_tensor):  # its array interface costs ~5 us, DLPack more
        dtype, device = _TORCH[1].get(x.dtype), x.get_device()  # device -1: CPU
        if dtype is not None and device >= 0 and x.is_contiguous():
            return _tuple_new(DeviceTensor, (x.data_ptr(), x.shape, dtype, device, x))  # torch.Size is a tuple
    try:
        import cupy
    except ImportError:  # pragma: no cover - cupy is a dependency of this package's GPU extra
        cupy = None
    if cupy is not None and isinstance(x, cupy.ndarray):
        dtype = str(x.dtype)
        if dtype not in ELEMENT_SIZE:
            raise TypeError(f"{name}: unsupported element type {dtype}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        return _tuple_new(DeviceTensor, (x.data.ptr, tuple(x.shape), dtype, x.device.id, x))
    cai = None
    try:
        cai = getattr(x, "__cuda_array_interface__", None)
    except (TypeError, RuntimeError):  # torch raises for bfloat16
        cai = None
    if cai is not None and cai["typestr"] in _CAI_TYPES:
        dtype = _CAI_TYPES[cai["typestr"]]
        shape = tuple(cai["shape"])
        if cai.get("strides") not in (None, _contiguous_strides(shape, ELEMENT_SIZE[dtype])):
            raise ValueError(f"{name} must be C-contiguous")
        return DeviceTensor(int(cai["data"][0]), shape, dtype, _device_of(x, int(cai["data"][0])), x)
    if hasattr(x, "__dlpack__"):
        return _from_dlpack(x, name)
    raise TypeError(f"{name}: expected a CUDA array (CuPy, __cuda_array_interface__ or __dlpack__), "
                    f"got {type(x).__name__}")


def pointers_and_keys(arrays: Sequence[Any], names: Sequence[str]) -> tuple[list[int], list]:
    """The device pointers of arrays (None: absent, pointer 0) and keys of what else a launch depends on (shape,
    element type, device), read with the fewest calls: a repeated call looks its checked launch up by these keys.
    Contiguous CUDA torch tensors key on torch's own shape and dtype objects; other arrays go through
    as_device_tensor (same checks)."""
    torch_tensor = _TORCH[0] or _torch_tensor_type()
    pointers, keys = [], []
    for x, name in zip(arrays, names):
        if x is None:
            pointers.append(0)
            keys.append(None)
        elif type(x) is torch_tensor and x.is_contiguous():
            pointers.append(x.data_ptr())
            keys.append((x.shape, x.dtype, x.get_device()))
        else:
            t = as_device_tensor(x, name)
            pointers.append(t.ptr)
            keys.append(t[1:4])
    return pointers, keys


_TORCH: list = [None, {}]  # torch.Tensor and torch's element types by name, once torch is imported


def _torch_tensor_type():
    """torch.Tensor if the process has imported torch (an array can only be a torch tensor then), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return None
    _TORCH[1].update({torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                      torch.int32: "int32"})
    _TORCH[0] = torch.Tensor
    return torch.Tensor


def _device_of(x: Any, ptr: int) -> int:
    index = getattr(getattr(x, "device", None), "index", None)  # torch: no driver call (safe in graph capture)
    if isinstance(index, int):
        return index
    import cupy

    attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    return int(attrs.device)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CUDA = 2
_DL_TYPES = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16", (0, 32): "int32"}


def _from_dlpack(x: Any, name: str) -> DeviceTensor:
    try:
        capsule = x.__dlpack__(stream=-1)  # -1: the consumer asks for no synchronisation (array API)
    except (TypeError, ValueError, RuntimeError, BufferError):
        capsule = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    if t.device.device_type != _DL_CUDA:
        raise TypeError(f"{name}: expected a CUDA tensor, got DLPack device type {t.device.device_type}")
    key = (t.dtype.code, t.dtype.bits)
    if key not in _DL_TYPES or t.dtype.lanes != 1:
        raise TypeError(f"{name}: unsupported element type (DLPack code {key[0]}, {key[1]} bits)")
    dtype = _DL_TYPES[key]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * ELEMENT_SIZE[dtype] for i in range(t.ndim))
        if any(d > 1 and s != c for d, s, c in zip(shape, strides, _contiguous_strides(shape, ELEMENT_SIZE[dtype]))):
            raise ValueError(f"{name} must be C-contiguous")
    # The capsule is not consumed; its destructor releases the export, while `x` keeps the memory alive.
    return DeviceTensor((t.data or 0) + t.byte_offset, shape, dtype, t.device.device_id, x)  # data is NULL when empty


def stream_pointer(stream: Any) -> int:
    """A raw cudaStream_t from None (CuPy's current stream), an int, or a CuPy/torch stream object."""
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream: expected None, an int or a stream object, got {type(stream).__name__}")


def empty(shape, dtype: str, device: int):
    """A new CuPy array (bfloat16 through ml_dtypes where CuPy accepts it)."""
    import cupy

    with cupy.cuda.Device(device):
        if dtype == "bfloat16":
            import ml_dtypes

            return cupy.empty(shape, dtype=ml_dtypes.bfloat16)
        return cupy.empty(shape, dtype=dtype)
