"""Old public names, kept for one release so that code written against them still runs: each use
warns (DeprecationWarning) and gives the object under its new name, the one the Node side uses
(the table "Names in TypeScript and Python" in python/README.md). Old module paths too (the layout of
issue 36: the package mirrors src/ folder for folder): ``import cuda_ipc.tensor_set`` warns and gives
the module ``cuda_ipc.tensors.tensor_set_transfer`` itself."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

#: old name -> new name, for every module that exported an old one (also in its module docs).
RENAMED: Mapping[str, str] = {
    "ArrayView": "DeviceArray",
    "Message": "ChannelMessage",
    "Slot": "ChannelSlot",
    "TensorSet": "TensorMap",
    "descriptor_from_json": "parse_descriptor_json",
}


def renamed_attribute(module: str, names: Mapping[str, object], name: str) -> Any:
    """A module's ``__getattr__`` for its old names: ``names`` maps each new name it has to the object."""
    new = RENAMED.get(name)
    if new is None or new not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} is deprecated, use {new} (the same object; the old name goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    return names[new]


#: old module path -> new module path (the moves of issue 36; docs/ARCHITECTURE.md lists the layout).
RENAMED_MODULES: Mapping[str, str] = {
    # the tensor layer, beside src/tensors/
    "cuda_ipc.tensor_set": "cuda_ipc.tensors.tensor_set_transfer",
    "cuda_ipc.tensor_map": "cuda_ipc.tensors.tensor_map",
    "cuda_ipc.tensor_wire": "cuda_ipc.tensors.wire",
    "cuda_ipc.update": "cuda_ipc.tensors.update",
    "cuda_ipc.lazy_allocations": "cuda_ipc.tensors.lazy_allocations",
    "cuda_ipc.nccl_tensor_set": "cuda_ipc.tensors.nccl_transfer",
    "cuda_ipc.nccl_tensor_send": "cuda_ipc.tensors.nccl_transfer_send",
    "cuda_ipc.chunk_pipeline": "cuda_ipc.tensors.chunk_pipeline",
    "cuda_ipc.packed_stream": "cuda_ipc.tensors.packed_stream",
    "cuda_ipc.copy_kernels": "cuda_ipc.tensors.kernels",
    "cuda_ipc.torch_pool": "cuda_ipc.tensors.torch_pool",
    "cuda_ipc.nccl_records": "cuda_ipc.link.messages.nccl_records",
    # the link by layer, beside src/link/
    **{f"cuda_ipc.link.{old}": f"cuda_ipc.link.{layer}.{new}" for layer, names in {
        "transport": ["frame", "fds", "large_message", "socket_file", "socket_path", "tcp_auth"],
        "lifetimes": ["lease", "gone"],
        "messages": ["message_format", "message_encoder", "message_decoder", "handlers", "deferred", "nccl_abort"],
        "connection": ["link", "frame_dispatch", "inbox", "outbox", "stream", "arriving"],
        "nccl": ["nccl_comms", "nccl_order", "nccl_outgoing", "fanout"],
        "transfers": ["device_transfers", "host_transfer", "host_bytes:host_bytes_transfer", "nccl_buffer:nccl_buffer_transfer"],
        "connect": ["listener", "tcp", "spawn", "endpoints"],
    }.items() for old, new in (n.split(":") if ":" in n else (n, n) for n in names)},
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and gives the module at its new path (the same object, so isinstance
    checks and module state agree), with a DeprecationWarning."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in RENAMED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = RENAMED_MODULES[spec.name]
        warnings.warn(f"module {spec.name} is deprecated, use {new} (the same module; the old path goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at its new path ran already


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())
