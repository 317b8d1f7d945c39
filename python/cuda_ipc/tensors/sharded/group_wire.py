"""The sync group's control messages (docs/PROTOCOL.md 9.3; src/tensors/sharded/group-wire.ts): plain
link messages, a JSON object whose ``shard`` field says which, binary fields as bytes. Each is parsed
strictly here: an unknown ``shard`` value, a missing or mistyped field, a number out of range is
``ShardError`` code ERR_SHARD_PROTOCOL (the receiver then closes the sender's link); fields a kind
does not define are ignored. Also the group's errors, whose ``detail`` says which ranks, which
destination tensors and which version."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ...errors import IpcError
from .layout_wire import MAX_LAYOUT_BYTES

#: Default bytes of a pair's NCCL chunk (execute-types.ts DEFAULT_SHARD_CHUNK_BYTES).
DEFAULT_SHARD_CHUNK_BYTES = 64 << 20
#: The most ranks a plan message lists (a bound on what a peer makes this side allocate).
MAX_GROUP_RANKS = 1 << 16
#: The longest serve address, reason or message text a peer may send.
MAX_TEXT = 4096
_U31 = 0x7FFFFFFF
_SAFE = 2**53 - 1
_NCCL_ID_BYTES = 128


class ShardError(IpcError):
    """A sync group's error: ``code`` ERR_SHARD_PEER_LOST, ERR_SHARD_PROTOCOL, ERR_SHARD_PLAN, ERR_TIMEOUT,
    ERR_SHARD_COPY (this rank's copy failed: the driver's error is its ``__cause__``) (or the code a hub
    refused a join with); ``detail`` a dict: ``ranks`` (the ranks lost),
    ``half_written`` (this rank's destination tensors whose runs of the failed sync may be partly
    written), ``version`` (this rank's, unchanged), ``waiting_for`` (ERR_TIMEOUT: the ranks still
    waited for)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None):
        super().__init__(code, message)
        self.detail: dict[str, Any] = dict(detail or {})

    def again(self, **changes: Any) -> "ShardError":
        """The same error with ``detail`` fields changed (a later sync raising the group's failure)."""
        return ShardError(self.code, str(self), {**self.detail, **changes})


def protocol_error(why: str) -> ShardError:
    return ShardError("ERR_SHARD_PROTOCOL", f"a sync group peer sent a bad control message: {why}; its link is closed")


@dataclass(frozen=True)
class Join:
    rank: int
    layout: bytes
    serve: str | None


@dataclass(frozen=True)
class Plan:
    epoch: int
    layouts: tuple[bytes, ...]
    serve: tuple[str | None, ...]
    chunk_bytes: int
    hub: int | None = None  # the hub's own rank (optional on the wire)


@dataclass(frozen=True)
class Planned:
    epoch: int
    fingerprint: str
    nccl: bool


@dataclass(frozen=True)
class NcclReady:
    id: bytes
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Ready:
    epoch: int
    nccl: NcclReady | None


@dataclass(frozen=True)
class Refused:
    code: str
    message: str


@dataclass(frozen=True)
class Failed:
    epoch: int
    code: str
    message: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Hello:
    epoch: int
    rank: int


@dataclass(frozen=True)
class Lost:
    epoch: int
    rank: int
    reason: str


@dataclass(frozen=True)
class Sources:
    epoch: int
    rank: int
    tensors: Any  # a received TensorMap


@dataclass(frozen=True)
class Go:
    epoch: int
    version: int


@dataclass(frozen=True)
class Done:
    epoch: int
    version: int


Message = Union[Join, Plan, Planned, Ready, Refused, Failed, Lost, Hello, Sources, Go, Done]

#: Which messages arrive on which link: from a member at the hub, from the hub at a member, from a
#: source on a serve link (at its destination), from a destination on a serve link (at its source).
AT_HUB = frozenset({"join", "planned"})
AT_MEMBER = frozenset({"plan", "ready", "lost", "refused", "failed"})
AT_DESTINATION = frozenset({"sources", "go"})
AT_SOURCE = frozenset({"hello", "done"})


# -- building (what this side sends) ---------------------------------------------------------------

def join_message(rank: int, layout: bytes, serve: str | None) -> dict[str, Any]:
    return {"shard": "join", "rank": rank, "layout": layout, "serve": serve}


def plan_message(epoch: int, layouts: list[bytes], serve: list[str | None], chunk_bytes: int, hub: int | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"shard": "plan", "epoch": epoch, "layouts": layouts, "serve": serve, "chunkBytes": chunk_bytes}
    if hub is not None:
        m["hub"] = hub
    return m


def planned_message(epoch: int, fingerprint: str, nccl: bool) -> dict[str, Any]:
    return {"shard": "planned", "epoch": epoch, "fingerprint": fingerprint, "nccl": nccl}


def ready_message(epoch: int, nccl: NcclReady | None) -> dict[str, Any]:
    return {"shard": "ready", "epoch": epoch, "nccl": None if nccl is None else {"id": nccl.id, "ranks": list(nccl.ranks)}}


def refused_message(code: str, message: str) -> dict[str, Any]:
    return {"shard": "refused", "code": code, "message": message[:MAX_TEXT]}


def failed_message(epoch: int, code: str, message: str, ranks: list[int]) -> dict[str, Any]:
    return {"shard": "failed", "epoch": epoch, "code": code, "message": message[:MAX_TEXT], "ranks": ranks}


def hello_message(epoch: int, rank: int) -> dict[str, Any]:
    return {"shard": "hello", "epoch": epoch, "rank": rank}


def lost_message(epoch: int, rank: int, reason: str) -> dict[str, Any]:
    return {"shard": "lost", "epoch": epoch, "rank": rank, "reason": reason[:MAX_TEXT]}


def sources_message(epoch: int, rank: int, tensors: Any) -> dict[str, Any]:
    return {"shard": "sources", "epoch": epoch, "rank": rank, "tensors": tensors}


def go_message(epoch: int, version: int) -> dict[str, Any]:
    return {"shard": "go", "epoch": epoch, "version": version}


def done_message(epoch: int, version: int) -> dict[str, Any]:
    return {"shard": "done", "epoch": epoch, "version": version}


# -- parsing (what a peer sent) --------------------------------------------------------------------

def _field(m: dict[str, Any], name: str, kind: str) -> Any:
    if name not in m:
        raise protocol_error(f"'{kind}' has no field {name!r}")
    return m[name]


def _int(m: dict[str, Any], name: str, kind: str, low: int = 0, high: int = _SAFE) -> int:
    v = _field(m, name, kind)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise protocol_error(f"'{kind}' field {name!r} must be an integer {low}..{high}, got {_show(v)}")
    return v


def _bool(m: dict[str, Any], name: str, kind: str) -> bool:
    v = _field(m, name, kind)
    if not isinstance(v, bool):
        raise protocol_error(f"'{kind}' field {name!r} must be a boolean, got {_show(v)}")
    return v


def _text(v: Any, what: str, kind: str, allow_none: bool = False) -> Any:
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise protocol_error(f"'{kind}' field {what} must be a string of at most {MAX_TEXT} characters{' or null' if allow_none else ''}, got {_show(v)}")
    return v


def _bytes(v: Any, what: str, kind: str, limit: int) -> bytes:
    if not isinstance(v, (bytes, bytearray)) or len(v) > limit:
        raise protocol_error(f"'{kind}' field {what} must be bytes (a Uint8Array) of at most {limit}, got {_show(v)}")
    return bytes(v)


def _show(v: Any) -> str:
    """A peer's value for a message: its type, and a short escaped form."""
    r = repr(v)
    return f"{type(v).__name__} {r[:60] + '...' if len(r) > 60 else r}"


def parse_message(value: Any, allowed: frozenset[str]) -> Message:
    """A received control message checked field by field; ShardError ERR_SHARD_PROTOCOL otherwise
    (also for a valid message that does not belong on this link: ``allowed``)."""
    if not isinstance(value, dict):
        raise protocol_error(f"expected an object with a 'shard' field, got {_show(value)}")
    kind = value.get("shard")
    if not isinstance(kind, str):
        raise protocol_error(f"the 'shard' field must be a string, got {_show(kind)}")
    if kind not in allowed:
        raise protocol_error(f"'shard': {_show(kind)} is not one of {', '.join(sorted(allowed))} (the messages this link carries)")
    m = value
    if kind == "join":
        serve = _text(_field(m, "serve", kind), "'serve'", kind, allow_none=True)
        if serve == "":
            raise protocol_error("'join' field 'serve' is empty; a link name or null")
        return Join(_int(m, "rank", kind, 0, _U31), _bytes(_field(m, "layout", kind), "'layout'", kind, MAX_LAYOUT_BYTES), serve)
    if kind == "plan":
        epoch = _int(m, "epoch", kind, 1)
        layouts = _field(m, "layouts", kind)
        serves = _field(m, "serve", kind)
        if not isinstance(layouts, list) or not 1 <= len(layouts) <= MAX_GROUP_RANKS:
            raise protocol_error(f"'plan' field 'layouts' must be a list of 1..{MAX_GROUP_RANKS} records, got {_show(layouts)}")
        if not isinstance(serves, list) or len(serves) != len(layouts):
            raise protocol_error(f"'plan' field 'serve' must be a list as long as 'layouts' ({len(layouts)}), got {_show(serves)}")
        return Plan(epoch, tuple(_bytes(x, f"'layouts'[{i}]", kind, MAX_LAYOUT_BYTES) for i, x in enumerate(layouts)),
                    tuple(_text(x, f"'serve'[{i}]", kind, allow_none=True) for i, x in enumerate(serves)),
                    _int(m, "chunkBytes", kind, 1), _int(m, "hub", kind, 0, _U31) if m.get("hub") is not None else None)
    if kind == "planned":
        fp = _field(m, "fingerprint", kind)
        if not isinstance(fp, str) or len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp):
            raise protocol_error(f"'planned' field 'fingerprint' must be 64 hex digits (SHA-256), got {_show(fp)}")
        return Planned(_int(m, "epoch", kind, 1), fp, _bool(m, "nccl", kind))
    if kind == "ready":
        epoch = _int(m, "epoch", kind, 1)
        n = _field(m, "nccl", kind)
        if n is None:
            return Ready(epoch, None)
        if not isinstance(n, dict):
            raise protocol_error(f"'ready' field 'nccl' must be null or an object, got {_show(n)}")
        uid = _bytes(_field(n, "id", "ready.nccl"), "'nccl.id'", kind, _NCCL_ID_BYTES)
        ranks = _field(n, "ranks", "ready.nccl")
        if len(uid) != _NCCL_ID_BYTES:
            raise protocol_error(f"'ready' field 'nccl.id' must be {_NCCL_ID_BYTES} bytes, got {len(uid)}")
        return Ready(epoch, NcclReady(uid, _ranks(ranks, "'nccl.ranks'", kind, False)))
    if kind == "failed":
        return Failed(_int(m, "epoch", kind, 1), _code(m, kind), _text(_field(m, "message", kind), "'message'", kind),
                      _ranks(_field(m, "ranks", kind), "'ranks'", kind, True))
    if kind == "hello":
        return Hello(_int(m, "epoch", kind, 1), _int(m, "rank", kind, 0, _U31))
    if kind == "refused":
        return Refused(_code(m, kind), _text(_field(m, "message", kind), "'message'", kind))
    if kind == "lost":
        return Lost(_int(m, "epoch", kind, 0), _int(m, "rank", kind, 0, _U31), _text(_field(m, "reason", kind), "'reason'", kind))
    if kind == "sources":
        tensors = _field(m, "tensors", kind)
        from ..tensor_map import TensorMap  # a link already imported it (the record's decoder)
        if not isinstance(tensors, TensorMap):
            raise protocol_error(f"'sources' field 'tensors' must be a tensor set, got {type(tensors).__name__}")
        return Sources(_int(m, "epoch", kind, 1), _int(m, "rank", kind, 0, _U31), tensors)
    if kind == "go":
        return Go(_int(m, "epoch", kind, 1), _int(m, "version", kind, 1))
    assert kind == "done"
    return Done(_int(m, "epoch", kind, 1), _int(m, "version", kind, 1))


def _code(m: dict[str, Any], kind: str) -> str:
    code = _field(m, "code", kind)
    if not isinstance(code, str) or not code.startswith("ERR_") or len(code) > 64:
        raise protocol_error(f"'{kind}' field 'code' must be an ERR_ code, got {_show(code)}")
    return code


def _ranks(v: Any, what: str, kind: str, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(v, list) or not (0 if allow_empty else 1) <= len(v) <= MAX_GROUP_RANKS or \
            any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= _U31 for r in v) or v != sorted(set(v)):
        raise protocol_error(f"'{kind}' field {what} must be a sorted list of distinct ranks, got {_show(v)}")
    return tuple(v)


def close_values(value: Any) -> None:
    """Closes what a refused message brought (a tensor set), so that nothing of the peer's stays held."""
    if isinstance(value, dict):
        t = value.get("tensors")
        close = getattr(t, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort on a message being refused
                pass
