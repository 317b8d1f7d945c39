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
    # the top-level modules and memory/, beside src/cuda/, src/ipc/, src/arrays/ (cuda_ipc.host and
    # cuda_ipc.native are packages now, re-exporting the old modules' names: no entry here)
    "cuda_ipc.driver": "cuda_ipc.cuda.driver",
    "cuda_ipc.device": "cuda_ipc.cuda.device",
    "cuda_ipc.streams": "cuda_ipc.cuda.stream",
    "cuda_ipc.descriptor": "cuda_ipc.ipc.descriptor",
    "cuda_ipc.torch_handle": "cuda_ipc.ipc.torch_handle",
    "cuda_ipc.host_array": "cuda_ipc.arrays.host_array",
    "cuda_ipc.resource": "cuda_ipc.leak",
    "cuda_ipc.memory.cache": "cuda_ipc.ipc.cache",
    "cuda_ipc.memory.event": "cuda_ipc.ipc.event",
    "cuda_ipc.memory.legacy": "cuda_ipc.ipc.legacy",
    "cuda_ipc.memory.pool": "cuda_ipc.ipc.pool",
    "cuda_ipc.memory.pool_interop": "cuda_ipc.ipc.pool_interop",
    "cuda_ipc.memory.buffer": "cuda_ipc.arrays.device_array",
    "cuda_ipc.memory.exports": "cuda_ipc.arrays.exports",
    "cuda_ipc.memory.owned": "cuda_ipc.arrays.owned",
}

#: old package split over several new modules -> {name it exported: the module that has it now}.
#: ``import cuda_ipc.memory`` gives a module that warns once and finds each name where it lives.
RENAMED_PACKAGES: Mapping[str, Mapping[str, str]] = {
    "cuda_ipc.memory": {
        **dict.fromkeys(["DeviceArray", "DeviceBuffer"], "cuda_ipc.arrays.device_array"),
        **dict.fromkeys(["Shared", "share"], "cuda_ipc.arrays.exports"),
        **dict.fromkeys(["_export_handles", "configure_import_cache", "legacy_cache_stats"], "cuda_ipc.ipc.cache"),
        "IpcEvent": "cuda_ipc.ipc.event",
        "ImportedPool": "cuda_ipc.ipc.pool",
        **dict.fromkeys(["CudaCoreImport", "ipc_buffer_descriptor"], "cuda_ipc.ipc.pool_interop"),
    },
}


def _split_package(name: str) -> ModuleType:
    """A stand-in for an old package whose modules went to several places: its names, found lazily
    where they live now (old names of them, such as ArrayView, warn as there), and its submodules
    through RENAMED_MODULES."""
    module = ModuleType(name, f"{name}: moved (issue 36); the names it exported live in {', '.join(sorted(set(RENAMED_PACKAGES[name].values())))}")
    module.__path__ = []  # a package: `import cuda_ipc.memory.cache` asks the finder below
    where = RENAMED_PACKAGES[name]
    modules = sorted(set(where.values()))
    setattr(module, "__all__", [n for n in where if not n.startswith("_")])

    def __getattr__(attr: str) -> Any:
        if attr in where:
            return getattr(importlib.import_module(where[attr]), attr)
        if attr in RENAMED:  # an old name of one of its names (ArrayView): the module that has the new one says so
            for m in modules:
                new = importlib.import_module(m)
                if hasattr(new, RENAMED[attr]) and RENAMED[attr] in where:
                    return getattr(new, attr)
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    setattr(module, "__getattr__", __getattr__)  # PEP 562: the module's own lookup of missing names
    return module


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and gives the module at its new path (the same object, so isinstance
    checks and module state agree), with a DeprecationWarning."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in RENAMED_MODULES and fullname not in RENAMED_PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in RENAMED_PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if spec.name in RENAMED_PACKAGES:
            warnings.warn(f"module {spec.name} is deprecated: its names moved to {', '.join(sorted(set(RENAMED_PACKAGES[spec.name].values())))} "
                          "(the same objects; the old path goes in the next release)", DeprecationWarning, stacklevel=2)
            return _split_package(spec.name)
        new = RENAMED_MODULES[spec.name]
        warnings.warn(f"module {spec.name} is deprecated, use {new} (the same module; the old path goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__  # the import machinery writes the old path's spec over it
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module at its new path ran already; it keeps its own spec (its name, file and loader).
        spec = self._specs.pop(module.__name__, None)
        if spec is not None:
            module.__spec__ = spec


# First in the path: an old path must never be found as a file of a new package that took its name
# (`cuda_ipc.memory.buffer` looked up in another folder), only here.
if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModule())
