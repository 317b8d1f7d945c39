"""The layout of an array over a buffer, as src/arrays/buffer-array.ts checks it: C-contiguous byte
strides, whether strides are C order or dense, and a torch tensor's dtype, shape and strides read
in a few calls (shares of single tensors and tensor sets describe thousands). Pure: no CUDA."""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..ipc.descriptor import torch_dtype


_c_strides_cache: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """C-contiguous byte strides of a shape without zero dimensions."""
    key = (shape, itemsize)
    s = _c_strides_cache.get(key)
    if s is None:
        out, step = [], itemsize
        for d in reversed(shape):
            out.append(step)
            step *= d
        s = tuple(reversed(out))
        if len(_c_strides_cache) > 4096:
            _c_strides_cache.clear()
        _c_strides_cache[key] = s
    return s


def torch_contiguous(t: Any) -> tuple[str, tuple[int, ...], tuple[int, ...], int] | None:
    """(dtype name, shape, byte strides, bytes) of a torch tensor that is C-contiguous, not empty and of a
    dtype cuda-ipc describes, in a few calls into torch (a first sync or update describes thousands of
    tensors); None for any other (described the long way)."""
    info = torch_dtype(t.dtype)
    if info is None or not t.is_contiguous():
        return None
    n = t.numel()
    if not n:
        return None
    shape = tuple(t.shape)
    return info[0], shape, c_strides(shape, info[1]), n * info[1]


def is_c_order(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> bool:
    """C-contiguous with NumPy's rule: dimensions of length 1 may have any stride."""
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def is_dense(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> bool:
    """The elements fill [0, extent) exactly (a permutation of a C-contiguous layout)."""
    expected = itemsize
    for n, s in sorted(((n, s) for n, s in zip(shape, strides) if n != 1), key=lambda x: x[1]):
        if s != expected:
            return False
        expected *= n
    return True


_torch_checked = False
_torch: ModuleType | None = None


def torch_module() -> ModuleType | None:
    """torch when it imports, else None (asked once; by name, so that a type checker never needs it)."""
    global _torch_checked, _torch
    if not _torch_checked:
        try:
            _torch = importlib.import_module("torch")
        except ImportError:
            _torch = None
        _torch_checked = True
    return _torch
