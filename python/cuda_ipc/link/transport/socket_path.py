"""Where listen()/connect() put their sockets (src/link/transport/socket-path.ts): ``<dir>/<name>.sock``, by
default in this user's directory as the Node side computes it.
"""
from __future__ import annotations

import os
import re

from ...errors import IpcError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_MAX_PATH_BYTES = 107
MY_UID = os.getuid()


def default_socket_directory() -> str:
    """Where listen()/connect() put sockets by default, as the Node side computes it:
    ``${XDG_RUNTIME_DIR or the temp dir}/cuda-ipc-<uid>``."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not base:
        # Node's os.tmpdir() on POSIX.
        base = os.environ.get("TMPDIR") or os.environ.get("TMP") or os.environ.get("TEMP") or "/tmp"
        if len(base) > 1 and base.endswith("/"):
            base = base[:-1]
    return os.path.join(base, f"cuda-ipc-{MY_UID}")


def socket_path(name: str, directory: str | None = None) -> str:
    """Validates ``name`` and returns its socket's path: ``<dir>/<name>.sock``."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise IpcError(
            "ERR_INVALID_ARG",
            f"link name {name!r} is not valid: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (no slashes)",
        )
    path = os.path.join(directory if directory is not None else default_socket_directory(), f"{name}.sock")
    if len(path.encode()) > _MAX_PATH_BYTES:
        raise IpcError("ERR_INVALID_ARG", f"the socket path {path} is longer than {_MAX_PATH_BYTES} bytes, the limit of a Unix socket address; use a shorter name or directory")
    return path
