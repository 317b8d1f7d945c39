"""GONE notices received (docs/PROTOCOL.md 3.2; the Node side is src/link/lifetimes/gone.ts): the peer freed
memory it had shared on this link, so nothing here keeps it alive without a user. A notice is
advice: an entry of a kind without a handler is ignored.

- ``legacy-buffer`` (key: the 64-byte CUipcMemHandle): idle mappings of it close now, busy ones at
  their last release instead of waiting idle in the cache (ipc/cache.py);
- ``ipc-pool`` (key: the 16-byte pool id): this link forgets the pool; its import goes once its last
  buffer here is closed.

(This package announces that it takes GONE frames, HELLO feature bit 1; it does not send them.)
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

#: The Link (connection/link.py) as this layer sees it: opaque, passed on or used by name, never imported
#: (it is above this layer; src/link/messages/handlers.ts types it `object` for the same reason).
Link = Any

#: kind -> handler(key, link), for every link of this process.
_handlers: dict[str, list[Callable[[bytes, "Link"], None]]] = {}


def register_gone_handler(kind: str, handler: Callable[[bytes, "Link"], None]) -> Callable[[], None]:
    """Runs ``handler(key, link)`` for each GONE entry of ``kind``; returns a function that unregisters it."""
    _handlers.setdefault(kind, []).append(handler)

    def unregister() -> None:
        hs = _handlers.get(kind, [])
        if handler in hs:
            hs.remove(handler)
    return unregister


def dispatch_gone(entries: list[tuple[str, bytes]], link: Link) -> None:
    for kind, key in entries:
        for h in list(_handlers.get(kind, ())):
            try:
                h(key, link)
            except Exception as e:  # noqa: BLE001 - advice: a failing handler must not close the link
                print(f"cuda_ipc: a GONE handler for {kind!r} failed: {e!r}", file=sys.stderr)


def _legacy_gone(key: bytes, _link: Any) -> None:
    if len(key) != 64:
        return
    from ...ipc import cache
    cache.forget_legacy_allocation(key)


def _pool_gone(key: bytes, link: Any) -> None:
    if len(key) != 16:
        return
    from ...ipc import cache
    received = link.handler_state.get(cache._POOLS_RECEIVED)
    pool = received.pop(key, None) if received is not None else None
    if pool is not None:
        pool.release()  # the link's hold: the import goes with its last buffer


register_gone_handler("legacy-buffer", _legacy_gone)
register_gone_handler("ipc-pool", _pool_gone)
