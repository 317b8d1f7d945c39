"""Old public names, kept for one release so that code written against them still runs: each use
warns (DeprecationWarning) and gives the object under its new name, the one the Node side uses
(the table "Names in TypeScript and Python" in python/README.md)."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
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
