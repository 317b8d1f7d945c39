"""Host memory: HostBuffer over memfd + mmap (src/host/). ``cuda_ipc.host`` was one module before the
layout of issue 36; its names stay importable from here (the module is host_buffer.py)."""
from .host_buffer import HostBuffer, _Mapping, host_address  # noqa: F401  (_Mapping: as the old module had it)

__all__ = ["HostBuffer", "host_address"]
