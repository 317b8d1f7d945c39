"""The package's optional native helper: ``cuda_ipc_py.so``, a small C library built and prebuilt with
the Node addon (binding.gyp target ``cuda_ipc_py``, sources in native/py/), loaded with ctypes. It
carries the hot path of a channel end (one call per acquire, publish, take, batch of takes and
release, instead of several ctypes calls to libatomic and tens of Python steps), the allocator
behind ``cuda_ipc.tensors.torch_pool`` (a PyTorch memory pool in a CUDA IPC pool), and a link's
frame sent with the RELEASE behind it in one system call (link/connection/outbox.py). Everything it does has a
pure standard-library path too, used where the library is missing; ``native_helper()`` says which
is active and why.

Where it is looked for, first found wins:

1. ``CUDA_IPC_PY_NATIVE_LIB``: a path to the library;
2. the npm package this Python package lies in (``<package>/python/cuda_ipc``): its local build
   (``build/Release/cuda_ipc_py.so``, as node-gyp-build prefers a local build), then its prebuilt
   one (``prebuilds/linux-<arch>/cuda_ipc_py.so``);
3. next to this file (``cuda_ipc/cuda_ipc_py.so``): where ``pip install`` from the npm package's
   ``python/`` folder puts it (python/setup.py copies the helper of the npm package around it);
4. an npm install of cuda-ipc in the working directory or a directory above it
   (``node_modules/cuda-ipc/``: its build, then its prebuilds), for a copy installed with pip from
   elsewhere beside a Node project.

``CUDA_IPC_PY_NATIVE=0`` turns it off (the pure path runs; tests use it to check both), ``=1``
requires it (the first use raises ERR_UNSUPPORTED, saying why, where it is missing).
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import IpcError

#: The interface version this package speaks (CIP_ABI_VERSION in native/py/*.c).
ABI_VERSION = 3
LIBRARY_NAME = "cuda_ipc_py.so"
_ARCHS = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class NativeHelper(NamedTuple):
    """Whether the native helper is in use (``active``), the file loaded (``path``), and ``reason``:
    why not, when it is not."""
    active: bool
    path: str | None
    reason: str


_lock = threading.Lock()
_state: tuple[NativeHelper, ctypes.PyDLL | None, ctypes.CDLL | None] | None = None


def _arch() -> str:
    return _ARCHS.get(platform.machine().lower(), platform.machine().lower())


def in_npm_package(root: Path) -> list[Path]:
    """Where the npm package at ``root`` keeps the helper: its local build, then its prebuilt one."""
    return [root / "build" / "Release" / LIBRARY_NAME, root / "prebuilds" / f"linux-{_arch()}" / LIBRARY_NAME]


def _candidates(here: Path | None = None, cwd: Path | None = None) -> list[Path]:
    """Every place looked in, in order (``here``: this package's folder; ``cwd``: the working directory)."""
    here = here or Path(__file__).resolve().parent.parent  # native/addon.py -> cuda_ipc/
    cwd = cwd or Path.cwd()
    found = in_npm_package(here.parent.parent) + [here / LIBRARY_NAME]  # <npm package>/python/cuda_ipc -> <npm package>
    for d in [cwd, *cwd.parents]:
        found += in_npm_package(d / "node_modules" / "cuda-ipc")
    return found


def _not_found_reason() -> str:
    """What a user can do where no helper was found: a pip user first, then a clone."""
    prebuilt = f"node_modules/cuda-ipc/prebuilds/linux-{_arch()}/{LIBRARY_NAME}"
    return (f"{LIBRARY_NAME} not found beside this package, in the npm package it came from, or in a node_modules/cuda-ipc "
            f"here or above; the pure-Python path runs. The npm package (npm install cuda-ipc) carries it prebuilt: "
            f"pip install node_modules/cuda-ipc/python copies it in, or set CUDA_IPC_PY_NATIVE_LIB={prebuilt} "
            f"(the path of that file); in a clone of the repository, npm run build:native builds it")


def _load() -> tuple[NativeHelper, ctypes.PyDLL | None, ctypes.CDLL | None]:
    setting = os.environ.get("CUDA_IPC_PY_NATIVE", "").strip().lower()
    if setting in ("0", "off", "no", "false"):
        return NativeHelper(False, None, "turned off (CUDA_IPC_PY_NATIVE=0)"), None, None
    named = os.environ.get("CUDA_IPC_PY_NATIVE_LIB")
    paths = [Path(named)] if named else [p for p in _candidates() if p.is_file()]
    if not paths:
        return NativeHelper(False, None, _not_found_reason()), None, None
    path = str(paths[0])
    try:
        # PyDLL: calls keep the GIL (every function but the spin returns within microseconds, and a
        # GIL handoff costs more than most of them); CDLL (the same file): calls that may wait.
        fast = ctypes.PyDLL(path)
        waits = ctypes.CDLL(path)
        version = fast.cip_abi_version()
    except (OSError, AttributeError) as e:
        return NativeHelper(False, path, f"{path} does not load: {e}"), None, None
    if version != ABI_VERSION:
        return NativeHelper(False, path, f"{path} speaks interface version {version}, this package {ABI_VERSION}: use the helper of the same cuda-ipc "
                           "version (pip install the python/ folder of the npm package it comes with, or npm run build:native in a clone)"), None, None
    return NativeHelper(True, path, ""), fast, waits


def _loaded() -> tuple[NativeHelper, ctypes.PyDLL | None, ctypes.CDLL | None]:
    global _state
    s = _state
    if s is None:
        with _lock:
            if _state is None:
                _state = _load()
            s = _state
    return s


def native_helper() -> NativeHelper:
    """Whether the native helper is in use, the file loaded, and why not when it is not."""
    return _loaded()[0]


def library(what: str) -> tuple[ctypes.PyDLL, ctypes.CDLL] | None:
    """The library (GIL-keeping and GIL-releasing handles), or None for the pure path. Raises
    ERR_UNSUPPORTED instead where CUDA_IPC_PY_NATIVE=1 asks for it and it is missing; ``what``
    names the feature for that message."""
    info, fast, waits = _loaded()
    if fast is None or waits is None:
        if os.environ.get("CUDA_IPC_PY_NATIVE", "").strip() == "1":
            raise IpcError("ERR_UNSUPPORTED", f"{what}: CUDA_IPC_PY_NATIVE=1 asks for the native helper, and it is missing: {info.reason}")
        return None
    return fast, waits


def helper_function(name: str) -> Callable[..., Any] | None:
    """The native helper's function ``name`` (GIL kept: for calls that never wait), or None where the
    helper is not in use. For a fast path beside a pure one: it never raises, CUDA_IPC_PY_NATIVE=1
    included (the features that need the helper say so where they are used)."""
    fast = _loaded()[1]
    return None if fast is None else getattr(fast, name)


def _reset_for_tests() -> None:
    """Forgets what was loaded, so that a test can change CUDA_IPC_PY_NATIVE (the library stays mapped)."""
    global _state
    with _lock:
        _state = None
