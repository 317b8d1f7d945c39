"""Native: the optional helper library, cuda_ipc_py.so, loaded with ctypes (src/native/; the module is
addon.py). ``cuda_ipc.native`` was one module before the layout of issue 36; its public names stay
importable from here."""
from .addon import ABI_VERSION, LIBRARY_NAME, NativeHelper, in_npm_package, library, native_helper

__all__ = ["ABI_VERSION", "LIBRARY_NAME", "NativeHelper", "in_npm_package", "library", "native_helper"]
