"""Authentication of TCP links (docs/PROTOCOL.md 2.3): both sides hold a shared token (at least 16
bytes; never sent) and prove it before any frame; the connecting side proves first:

1. each side sends a 48-byte challenge: u32 magic "CIPA", u8 version 2, u8 role (1 connecting,
   2 listening), u16 + 8 reserved bytes (0), a 32-byte random nonce;
2. the connecting side, on the listener's challenge, sends its proof: HMAC-SHA256(token, "cuda-ipc
   tcp auth v1" | u8 role of the prover | listener's nonce | connector's nonce);
3. the listener compares it in constant time with the one the connecting role should give and only
   then sends its own proof, which the connecting side checks alike. A mismatch, or the connection
   ending first, is ERR_AUTH_FAILED; a listener proves nothing to a peer that has not proved the
   token, so one connection gives nothing to test guesses of a token against. As the proofs differ
   only in the role byte, a proof sent back to its sender fails. Version 1 (both sides proved at
   once) is refused with both versions named.

Authenticator runs one side's exchange over a non-blocking StreamSocket, so that a listener can
run many at once (tcp.py) and a silent connection holds up nobody.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import ssl
import struct
from typing import TYPE_CHECKING

from ...errors import IpcError

if TYPE_CHECKING:
    from .tcp_transport import StreamSocket

#: The environment variable a token is read from when none is passed.
TOKEN_ENV = "CUDA_IPC_TOKEN"
MIN_TOKEN_BYTES = 16
ROLE_CONNECTOR = 1
ROLE_LISTENER = 2
CHALLENGE_MAGIC = 0x41504943  # "CIPA"
#: 2: the connecting side proves first (1: both at once, no longer spoken).
CHALLENGE_VERSION = 2
NONCE_BYTES = 32
PROOF_BYTES = 32
_CHALLENGE_HEAD = struct.Struct("<IBBH8s")
CHALLENGE_BYTES = _CHALLENGE_HEAD.size + NONCE_BYTES
_LABEL = b"cuda-ipc tcp auth v1"


def resolve_token(token: str | bytes | bytearray | None, what: str) -> bytes:
    """The token's bytes (a str is UTF-8), from ``token`` or else CUDA_IPC_TOKEN. No token, or one
    shorter than 16 bytes, is ERR_AUTH_FAILED: the caller fails before anything goes on the wire."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
        if token is None:
            raise IpcError("ERR_AUTH_FAILED", f"{what}: a TCP link needs a token shared by both sides: pass token= (at least "
                           f"{MIN_TOKEN_BYTES} bytes, e.g. secrets.token_hex(16)) or set {TOKEN_ENV}")
    if isinstance(token, str):
        secret = token.encode("utf-8")
    elif isinstance(token, (bytes, bytearray)):
        secret = bytes(token)
    else:
        raise TypeError(f"{what}: token must be a str or bytes, got {type(token).__name__}")
    if len(secret) < MIN_TOKEN_BYTES:
        raise IpcError("ERR_AUTH_FAILED", f"{what}: the token is {len(secret)} bytes; a TCP link's token must be at least "
                       f"{MIN_TOKEN_BYTES} bytes (e.g. secrets.token_hex(16))")
    return secret


def challenge(role: int, nonce: bytes) -> bytes:
    return _CHALLENGE_HEAD.pack(CHALLENGE_MAGIC, CHALLENGE_VERSION, role, 0, bytes(8)) + nonce


def read_challenge(data: bytes, peer_role: int, peer_name: str) -> bytes:
    """The nonce of the peer's challenge; ERR_FRAME_INVALID for anything out of spec."""
    magic, version, role, reserved, reserved8 = _CHALLENGE_HEAD.unpack_from(data)
    if magic == CHALLENGE_MAGIC and version != CHALLENGE_VERSION:
        raise IpcError("ERR_FRAME_INVALID", f"the {peer_name} speaks authentication version {version}, this build {CHALLENGE_VERSION}"
                       + (" (version 1, where both sides proved at once, is no longer spoken: update the older side)" if version == 1 else "")
                       + "; the connection was closed")
    if magic != CHALLENGE_MAGIC or role != peer_role or reserved or any(reserved8):
        raise IpcError("ERR_FRAME_INVALID", f"the {peer_name} did not open with a cuda-ipc TCP link challenge (magic 0x{magic:x}, "
                       f"version {version}, role {role}); it is not a cuda-ipc TCP link or speaks another version")
    return data[_CHALLENGE_HEAD.size:]


def proof(secret: bytes, prover_role: int, listener_nonce: bytes, connector_nonce: bytes) -> bytes:
    return hmac.new(secret, _LABEL + bytes([prover_role]) + listener_nonce + connector_nonce, hashlib.sha256).digest()


class Authenticator:
    """One side's exchange on ``conn``: ``advance()`` does what it can without waiting and returns the
    poll events to wait for, or 0 once the peer proved the token (and a listener's proof is sent).
    Raises ERR_AUTH_FAILED (wrong token, the connection ended), ERR_FRAME_INVALID (not a cuda-ipc
    peer) or, connecting, ERR_LISTENER_BUSY when the listener closed the connection before this side
    could prove anything (a listener with no room does so; worth another try)."""

    def __init__(self, conn: StreamSocket, secret: bytes, role: int, peer_name: str):
        self._conn = conn
        self._secret = secret
        self._role = role
        self._peer_role = ROLE_LISTENER if role == ROLE_CONNECTOR else ROLE_CONNECTOR
        self._peer_name = peer_name
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self._out = memoryview(challenge(role, self._nonce))
        self._in = bytearray(CHALLENGE_BYTES)
        self._have = 0
        self._expected: bytes | None = None  # the peer's proof, once its challenge came
        self._mine = b""  # this side's proof, once the peer's challenge came
        #: This side's proof was queued (the connecting side's, once the listener's challenge came).
        self.proved = False
        self.done = False

    @property
    def challenged(self) -> bool:
        """Whether the peer's challenge arrived (and checked out)."""
        return self._expected is not None

    def advance(self) -> int:
        conn = self._conn
        try:
            while True:
                if self._out:
                    n = conn.send(self._out)
                    if n is None:
                        return conn.want
                    self._out = self._out[n:]
                    continue
                if self.done:
                    return 0
                n = conn.recv_into(memoryview(self._in)[self._have:])
                if n is None:
                    return conn.want
                if n == 0:
                    raise self._failed("closed the connection")
                self._have += n
                if self._have == len(self._in):
                    self._took(bytes(self._in))
        except ssl.SSLError as e:  # e.g. a listener refusing this side's certificate (TLS 1.3 says so only now)
            raise IpcError("ERR_AUTH_FAILED", f"the TLS connection with the {self._peer_name} failed during authentication: "
                           f"{e.reason or e}") from None
        except OSError as e:
            raise self._failed(f"reset the connection ({e.strerror or e})") from None

    def _took(self, data: bytes) -> None:
        if self._expected is None:
            peer_nonce = read_challenge(data, self._peer_role, self._peer_name)
            listener, connector = (self._nonce, peer_nonce) if self._role == ROLE_LISTENER else (peer_nonce, self._nonce)
            self._mine = proof(self._secret, self._role, listener, connector)
            self._expected = proof(self._secret, self._peer_role, listener, connector)
            if self._role == ROLE_CONNECTOR:  # the connecting side proves first
                self._out = memoryview(self._mine)
                self.proved = True
            self._in, self._have = bytearray(PROOF_BYTES), 0
            return
        if not hmac.compare_digest(data, self._expected):
            raise IpcError("ERR_AUTH_FAILED", f"the {self._peer_name} did not prove the token: the two sides hold different tokens "
                           f"(token= or {TOKEN_ENV}); its proof does not match")
        if self._role == ROLE_LISTENER:  # only now: the peer proved the token
            self._out = memoryview(self._mine)
            self.proved = True
        self.done = True

    def _failed(self, how: str) -> IpcError:
        if self._role == ROLE_CONNECTOR and not self.proved:
            e = IpcError("ERR_LISTENER_BUSY", f"the {self._peer_name} {how} before this side could prove the token: it is at its "
                         "bound of connections still authenticating (max_pending, or its bound per address), or it is not a "
                         "cuda-ipc listener")
        elif self._role == ROLE_CONNECTOR:
            e = IpcError("ERR_AUTH_FAILED", f"the {self._peer_name} did not prove the token: the two sides hold different tokens "
                         f"(token= or {TOKEN_ENV}): it {how} after this side's proof, without its own")
        else:
            e = IpcError("ERR_AUTH_FAILED", f"the {self._peer_name} {how} before it proved the token")
        return e
