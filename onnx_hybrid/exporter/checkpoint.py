"""Lazy access to the safetensors files of a checkpoint, under normalised tensor names.

Only headers are read up front. Tensor data is read slice by slice through a fresh memory map that
is closed right after, so the pages a slice touched leave the process RSS again. The header is read
here rather than through ``safetensors.safe_open`` because its NumPy slices cannot hold bfloat16.
Names are normalised to the text-only runtime form (docs/model.md#checkpoint-names): ``model.language_model.X``
becomes ``model.X``; the vision tower is skipped; the MTP head keeps its ``mtp.*`` names.
"""

from __future__ import annotations

import json
import math
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ml_dtypes

from .errors import ExportError

_NUMPY_DTYPES = {"BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16),
                 "F32": np.dtype(np.float32), "F64": np.dtype(np.float64)}
_SKIPPED_PREFIXES = {"model.visual.": "vision tower"}
_WRAPPER_PREFIX = "model.language_model."


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    key: str  # name inside the file
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string (BF16, F16, F32, ...)
    offset: int  # byte offset of the data in the file

    @property
    def numpy_dtype(self) -> np.dtype:
        try:
            return _NUMPY_DTYPES[self.dtype]
        except KeyError:
            raise ExportError(f"{self.key} in {self.file.name}: unsupported dtype {self.dtype}; "
                              f"supported: {', '.join(_NUMPY_DTYPES)}") from None


class Checkpoint:
    """Normalised tensor names -> where they are stored."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        self.tensors: dict[str, StoredTensor] = {}
        self.skipped: dict[str, int] = {}
        for file in _safetensors_files(self.model_dir):
            for stored in _read_header(file):
                self._add(stored)

    def _add(self, stored: StoredTensor) -> None:
        for prefix, what in _SKIPPED_PREFIXES.items():
            if stored.key.startswith(prefix):
                self.skipped[what] = self.skipped.get(what, 0) + 1
                return
        name = stored.key
        if name.startswith(_WRAPPER_PREFIX):
            name = "model." + name[len(_WRAPPER_PREFIX):]
        self.tensors[name] = stored

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str) -> StoredTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ExportError(f"checkpoint {self.model_dir} has no tensor {name!r}") from None

    def read(self, name: str, index: tuple = ()) -> np.ndarray:
        """A copy of ``tensor[index]`` (bf16 as ml_dtypes.bfloat16)."""
        stored = self.get(name)
        if not stored.shape or 0 in stored.shape:
            return np.zeros(stored.shape, stored.numpy_dtype)[index]
        count = math.prod(stored.shape)
        with open(stored.file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = np.frombuffer(mapped, stored.numpy_dtype, count, stored.offset).reshape(stored.shape)
            data = np.array(view[index])
            del view  # the map closes (and its touched pages leave RSS) only without live views
        return data


def _read_header(file: Path) -> list[StoredTensor]:
    """The tensors a safetensors file declares; a truncated or foreign file is an ExportError here,
    not a NumPy error halfway through writing the weights."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        base = 8 + size
        data_bytes = file.stat().st_size - base
        tensors = []
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, stop = info["data_offsets"]
            if not 0 <= start <= stop <= data_bytes:
                raise ValueError(f"{key}: data_offsets [{start}, {stop}] lie outside its {data_bytes} data bytes")
            tensors.append(StoredTensor(file, key, tuple(info["shape"]), info["dtype"], base + start))
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # JSONDecodeError is a ValueError
        raise ExportError(f"{file} is not a readable safetensors file: {error}") from None
    return tensors


def _safetensors_files(model_dir: Path) -> list[Path]:
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir} is not a folder")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (ValueError, AttributeError) as error:
            raise ExportError(f"{index}: not a safetensors index ({error})") from None
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ExportError(f"{index.name} lists shard(s) that are missing: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir}: no *.safetensors files found (only safetensors checkpoints are supported)")
    return files
