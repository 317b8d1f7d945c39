"""NCCL's results and the errors of the NCCL layer, the same as the Node side (src/nccl/errors.ts):
``NcclError`` (code ``ERR_NCCL``) names the result, the call and what the library said about it;
``NcclUnavailableError`` (code ``ERR_NCCL_UNAVAILABLE``) every place looked in for the library."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import IpcError

#: ncclResult_t values by name (nccl.h).
NCCL_RESULTS: dict[str, int] = {
    "ncclSuccess": 0,
    "ncclUnhandledCudaError": 1,
    "ncclSystemError": 2,
    "ncclInternalError": 3,
    "ncclInvalidArgument": 4,
    "ncclInvalidUsage": 5,
    "ncclRemoteError": 6,
    "ncclInProgress": 7,
    "ncclTimeout": 8,
}
SUCCESS = 0
IN_PROGRESS = 7
_NAMES = {v: k for k, v in NCCL_RESULTS.items()}


def result_name(result: int) -> str:
    """The name of an ncclResult_t, e.g. ``ncclRemoteError`` for 6 (``ncclResult(<n>)`` when unknown)."""
    return _NAMES.get(result, f"ncclResult({result})")


def _hint(result: int) -> str:
    if result in (NCCL_RESULTS["ncclRemoteError"], NCCL_RESULTS["ncclSystemError"], NCCL_RESULTS["ncclTimeout"]):
        return ("a peer exited or the network failed: abort() the communicator (close() would wait for every rank) "
                "and make a new one")
    if result == NCCL_RESULTS["ncclUnhandledCudaError"]:
        return "a CUDA call inside NCCL failed; run with NCCL_DEBUG=WARN for details"
    if result == NCCL_RESULTS["ncclInvalidUsage"]:
        return "every rank must load the same NCCL version and use its own GPU; run with NCCL_DEBUG=WARN for details"
    return ""


class NcclError(IpcError):
    """An NCCL call failed (code ``ERR_NCCL``): ``result`` is NCCL's name for it, ``call`` the
    function, ``description`` ncclGetErrorString's text and ``last_error`` ncclGetLastError's."""

    def __init__(self, status: int, call: str, description: str, last_error: str):
        result = result_name(status)
        hint = _hint(status)
        super().__init__(
            "ERR_NCCL",
            f"{call} failed: {result} ({status}): {description or 'no description'}"
            + (f"; NCCL says: {last_error.strip()}" if last_error else "") + (f". {hint}" if hint else ""),
        )
        self.result = result
        self.status = status
        self.call = call
        self.description = description
        self.last_error = last_error


@dataclass(frozen=True)
class NcclAttempt:
    """One place load_nccl looked in, and why it was not used."""

    #: "option" (the path given), "env" (CUDA_IPC_NCCL_LIBRARY), "system" (libnccl.so.2 on the loader's path) or "wheel".
    source: str
    #: The file tried, or the place looked in when it yielded none.
    path: str
    error: str


class NcclUnavailableError(IpcError):
    """No usable NCCL library was found (code ``ERR_NCCL_UNAVAILABLE``); ``attempts`` says where it looked."""

    def __init__(self, message: str, attempts: list[NcclAttempt]):
        super().__init__("ERR_NCCL_UNAVAILABLE", message)
        self.attempts = attempts
