"""Typed errors, the same codes as the Node side (src/errors.ts).

``CudaError`` mirrors a failed driver call; ``IpcError`` carries a stable ``code`` that programs can
switch on, and a message that says what went wrong and what to do instead.
"""
from __future__ import annotations


class CudaError(Exception):
    """A CUDA driver call failed. ``code`` is the driver's name for the status."""

    def __init__(self, status: int, code: str, description: str, call: str, hint: str | None = None):
        super().__init__(f"{call} failed: {code} ({status}): {description}" + (f". {hint}" if hint else ""))
        self.status = status
        self.code = code
        self.description = description
        self.call = call


class IpcError(Exception):
    """A cuda-ipc usage or protocol error with a stable ``code`` (e.g. ``ERR_PEER_GONE``)."""

    def __init__(self, code: str, message: str, *, limit: str | None = None):
        super().__init__(message)
        self.code = code
        #: For a bound that was reached (ERR_MESSAGE_TOO_LARGE, ...): the option that sets it.
        self.limit = limit

    def __repr__(self) -> str:
        return f"IpcError({self.code!r}, {str(self)!r})"


def frame_invalid(why: str) -> IpcError:
    return IpcError(
        "ERR_FRAME_INVALID",
        f"received an invalid link frame: {why}; the peer is not speaking the cuda-ipc link protocol "
        "(or is a different version)",
    )
