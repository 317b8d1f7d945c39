"""Closing file descriptors that arrived with (or were handed over for) a frame, quietly
(src/link/transport/fds.ts): by the time they are closed here, one that is gone already has nothing left to
release.
"""
from __future__ import annotations

import os
from collections.abc import Iterable


def close_fds(fds: Iterable[int] | None) -> None:
    """Closes every fd of ``fds`` (-1 marks one taken by a decoded value), ignoring failures."""
    for fd in fds or ():
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
