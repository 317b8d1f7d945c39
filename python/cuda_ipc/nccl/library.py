"""Finding and loading NCCL through ctypes (standard library only), as the Node side does
(src/nccl/library.ts): the file named by ``CUDA_IPC_NCCL_LIBRARY`` (alone: a chosen library is
never silently replaced), else the system's libnccl.so.2 (the loader's search path), else the copy
PyTorch's wheels install (``nvidia/nccl/lib/libnccl.so.2``, found without importing torch). Each
candidate is first loaded in a throw-away process, so that one that crashes when loaded cannot take
this process down; this process then loads the file the loader chose there, by its full path.

The ABI subset and its loading live in abi.py.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import site
import subprocess
import sys
import threading
from typing import Any

from .abi import NCCL_UNIQUE_ID_BYTES, SUCCESS, LoadError, NcclUniqueIdStruct, open_library
from .errors import NcclAttempt, NcclError, NcclUnavailableError

NCCL_LIBRARY_ENV = "CUDA_IPC_NCCL_LIBRARY"
SYSTEM_NCCL = "libnccl.so.2"
#: A real libnccl maps a few hundred MB when loaded: seconds at worst. A minute means it hangs.
PROBE_TIMEOUT_S = 60.0

# The probe: abi.py's open_library in a fresh interpreter (that file alone, not the package), one
# JSON line per step, as the Node side's probe-child.ts prints them.
_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("cuda_ipc_nccl_abi", sys.argv[1])
abi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abi)
for i, path in enumerate(sys.argv[2:]):
    print(json.dumps({"trying": i}), flush=True)
    try:
        _, _, version, found = abi.open_library(path)
        print(json.dumps({"ok": True, "path": found, "version": version}), flush=True)
        break
    except abi.LoadError as e:
        print(json.dumps({"ok": False, "code": e.code, "message": str(e)}), flush=True)
"""
_ABI_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "abi.py")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def probe_libraries(paths: list[str], timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """Loads ``paths`` in order in throw-away processes until one loads: one outcome per path tried
    (``{"ok": True, "path", "version"}`` or ``{"ok": False, "code", "message"}``; the last is the
    success, if any). Never raises."""
    outcomes: list[dict[str, Any]] = []
    while len(outcomes) < len(paths):
        start = len(outcomes)
        # -I: PYTHONPATH and user site-packages of the environment play no part; -S: no site import.
        args = [sys.executable, "-I", "-S", "-c", _PROBE, _ABI_FILE, *paths[start:]]
        try:
            run = subprocess.run(args, capture_output=True, timeout=timeout, text=True, errors="replace")
            stdout, stderr, rc = run.stdout, run.stderr, run.returncode
            died = "" if rc == 0 else (f"loading it killed the probe process with {signal.Signals(-rc).name}" if rc < 0
                                       else f"the probe process exited with status {rc} while loading it")
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr, died = "", f"it did not finish loading within {timeout:g} s"
        except OSError as e:
            stdout, stderr, died = "", "", f"the probe process could not start: {e}"
        tail = _printable(" | ".join(stderr.strip().splitlines()[-3:]))
        if tail:
            died += f" (its stderr: {tail})"
        results: dict[int, dict[str, Any]] = {}
        trying: int | None = None
        for line in stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a library may print while it loads
            if not isinstance(msg, dict):
                continue
            if isinstance(msg.get("trying"), int):
                trying = msg["trying"]
            elif trying is not None and "ok" in msg:
                results[trying] = msg
                trying = None
        advanced = False
        for i in range(len(paths) - start):
            o = results.get(i)
            if o is None:
                if trying == i or not advanced:
                    outcomes.append({"ok": False, "code": "ERR_PROBE", "message": died or "the probe process said nothing"})
                break
            outcomes.append(o)
            advanced = True
            if o["ok"]:
                return outcomes
    return outcomes


def wheel_libraries() -> tuple[list[str], str]:
    """The wheel copies of libnccl.so.2 this interpreter can see (existing files), or why there are
    none. find_spec("nvidia") names the namespace package's folders without importing torch."""
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
        if spec is not None and spec.submodule_search_locations:
            dirs += [str(d) for d in spec.submodule_search_locations]
    except (ImportError, ValueError):
        pass
    roots = list(getattr(site, "getsitepackages", lambda: [])())
    try:
        roots.append(site.getusersitepackages())
    except AttributeError:
        pass
    for root in roots + sys.path:
        d = os.path.join(root or ".", "nvidia")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    candidates = [os.path.join(d, "nccl", "lib", SYSTEM_NCCL) for d in dirs]
    found = [p for p in dict.fromkeys(candidates) if os.path.isfile(p)]
    if found:
        return found, ""
    if candidates:
        return [], f"no nvidia/nccl/lib/libnccl.so.2 in {len(candidates)} nvidia package folder(s)"
    return [], "this Python sees no nvidia package (pip install nvidia-nccl-cu12, or torch, installs one)"


def format_version(code: int) -> str:
    """NCCL's version code as text: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z since 2.9."""
    if code < 0:
        return f"unknown ({code})"
    major = code // 10000 if code >= 10000 else code // 1000
    minor = (code % 10000) // 100 if code >= 10000 else (code % 1000) // 100
    return f"{major}.{minor}.{code % 100}"


class NcclLibrary:
    """A loaded NCCL library (``load_nccl()``): ``path`` (the file), ``version`` ('2.28.9'),
    ``version_code`` (22809), ``source`` ('env', 'system' or 'wheel'). Loaded for the life of the
    process; one object per file."""

    def __init__(self, lib: ctypes.CDLL, fns: dict[str, Any], version_code: int, path: str, source: str):
        self._lib = lib  # keeps the library loaded
        self._fns = fns
        self.version_code = version_code
        self.version = format_version(version_code)
        self.path = path
        self.source = source

    def fn(self, name: str) -> Any:
        """The entry point ``name`` (of the table above)."""
        return self._fns[name]

    def error(self, result: int, call: str, comm: int | None = None) -> NcclError:
        """The NcclError of ``result`` from ``call``, with the library's own texts."""
        desc = self._fns["ncclGetErrorString"](result)
        last = self._fns["ncclGetLastError"](comm)
        return NcclError(result, call, (desc or b"").decode(errors="replace"), (last or b"").decode(errors="replace"))

    def check(self, result: int, call: str, comm: int | None = None) -> None:
        """Raises NcclError unless ``result`` is ncclSuccess."""
        if result != SUCCESS:
            raise self.error(result, call, comm)

    def unique_id(self) -> bytes:
        """A new unique id (ncclGetUniqueId, 128 bytes) for one communicator: made by one rank and
        sent to the others."""
        uid = NcclUniqueIdStruct()
        self.check(self._fns["ncclGetUniqueId"](ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), NCCL_UNIQUE_ID_BYTES)

    def __repr__(self) -> str:
        return f"<cuda_ipc.nccl.NcclLibrary {self.version} {self.path} ({self.source})>"


_lock = threading.Lock()
_by_file: dict[str, NcclLibrary] = {}
_found: dict[str, NcclLibrary] = {}  # what load_nccl found, by what was asked

_PLACES = {
    "option": "the path given",
    "env": NCCL_LIBRARY_ENV,
    "system": f"the system's {SYSTEM_NCCL} (the dynamic loader's search path: LD_LIBRARY_PATH, ldconfig)",
    "wheel": "PyTorch's NCCL wheel",
}


def _forget_discoveries() -> None:
    """Forgets what load_nccl found (tests change the environment it searches); libraries stay loaded."""
    with _lock:
        _found.clear()


def load_nccl(path: str | None = None) -> NcclLibrary:
    """Finds and loads NCCL: ``path`` (only it), else the file ``CUDA_IPC_NCCL_LIBRARY`` names (only
    it), else the system's libnccl.so.2, else PyTorch's wheel copy. Raises NcclUnavailableError
    (``ERR_NCCL_UNAVAILABLE``), whose message and ``attempts`` name every place looked in and why
    each failed. Every rank of a communicator must load the same NCCL version; a process that
    imported torch has torch's copy loaded, so name that file in every rank (CUDA_IPC_NCCL_LIBRARY)
    when Node and PyTorch share a communicator."""
    if path is not None and (not isinstance(path, str) or not path):
        raise TypeError("path must be a non-empty string or None")
    env = os.environ.get(NCCL_LIBRARY_ENV) or None
    if path is not None:
        chosen: list[tuple[str, str]] | None = [("option", path)]
    elif env is not None:
        chosen = [("env", env)]
    else:
        chosen = None
    key = f"{chosen[0][0]}:{chosen[0][1]}" if chosen else "auto"
    with _lock:
        found = _found.get(key)
        if found is not None:
            return found
        attempts: list[NcclAttempt] = []
        lib = _try(chosen or [("system", SYSTEM_NCCL)], attempts)
        if lib is None and chosen is None:
            wheels, why = wheel_libraries()
            if wheels:
                lib = _try([("wheel", p) for p in wheels], attempts)
            else:
                attempts.append(NcclAttempt("wheel", f"nvidia/nccl/lib/{SYSTEM_NCCL} in this Python's site-packages", why))
        if lib is None:
            lines = "\n".join(f"  - {_PLACES[a.source]}: {a.path}: {a.error}" for a in attempts)
            raise NcclUnavailableError(
                f"no usable NCCL library was found; looked in:\n{lines}\nInstall NCCL 2.14 or newer (e.g. apt install "
                f"libnccl2, or pip install nvidia-nccl-cu12), or name the file with {NCCL_LIBRARY_ENV}=/path/to/libnccl.so.2",
                attempts)
        _found[key] = lib
        return lib


def _try(candidates: list[tuple[str, str]], attempts: list[NcclAttempt]) -> NcclLibrary | None:
    outcomes = probe_libraries([p for _, p in candidates])
    for (source, path), o in zip(candidates, outcomes):
        if not o["ok"]:
            attempts.append(NcclAttempt(source, path, str(o["message"])))
            continue
        file = str(o["path"])
        lib = _by_file.get(file)
        if lib is not None:
            return lib
        try:
            handle, fns, version, resolved = open_library(file)
        except LoadError as e:
            attempts.append(NcclAttempt(source, file, f"it loaded in the probe process but not here: {e}"))
            continue
        lib = _by_file.setdefault(resolved, NcclLibrary(handle, fns, version, resolved, source))
        _by_file[file] = lib
        return lib
    return None
