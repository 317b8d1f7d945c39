"""What the package's resources have in common (the Node side's disposables, src/leak.ts): ``close()``,
use in a ``with`` block, and a close when one is collected unclosed (a received buffer dropped
without close() still ends its lease), and what a received object holds of its sender's lease."""
from __future__ import annotations

from typing import Protocol, TypeVar

_R = TypeVar("_R", bound="Resource")


class Resource:
    """A base for objects with ``close()``, ``closed`` and a ``_closed`` flag: leaving ``with`` closes
    them, and so does their collection, quietly (there is nobody to report a failure to then)."""

    __slots__ = ()
    _closed: bool

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # The flag, not the property: a buffer collected costs no call more. (A default: its constructor may have failed.)
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass


class ReceivedLease(Protocol):
    """The receiving side of one lease (link/lifetimes/lease.py makes them), as a transfer handler's
    decode() gets it: the value calls ``end()`` once it is finally released. Here, in the base layer,
    because what is received (ipc/, arrays/, host/) holds one below the link that leases it."""

    @property
    def id(self) -> int: ...

    @property
    def ended(self) -> bool: ...

    def end(self) -> None: ...
