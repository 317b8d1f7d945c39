"""The old public names (before the names matched the Node side's) still work for one release:
each use warns with DeprecationWarning and gives the same object as the new name."""
import importlib
import unittest
import warnings

OLD = [
    ("cuda_ipc", "ArrayView", "DeviceArray"),
    ("cuda_ipc", "Message", "ChannelMessage"),
    ("cuda_ipc", "Slot", "ChannelSlot"),
    ("cuda_ipc", "TensorSet", "TensorMap"),
    ("cuda_ipc", "descriptor_from_json", "parse_descriptor_json"),
    ("cuda_ipc.memory", "ArrayView", "DeviceArray"),
    ("cuda_ipc.memory.buffer", "ArrayView", "DeviceArray"),
    ("cuda_ipc.channel", "Message", "ChannelMessage"),
    ("cuda_ipc.channel", "Slot", "ChannelSlot"),
    ("cuda_ipc.channel.consumer", "Message", "ChannelMessage"),
    ("cuda_ipc.channel.producer", "Slot", "ChannelSlot"),
    ("cuda_ipc.tensors.tensor_map", "TensorSet", "TensorMap"),
    ("cuda_ipc.tensors.tensor_set_transfer", "TensorSet", "TensorMap"),
    ("cuda_ipc.descriptor", "descriptor_from_json", "parse_descriptor_json"),
]


class RenamedTest(unittest.TestCase):
    def test_old_names_warn_and_give_the_new_object(self) -> None:
        for module, old, new in OLD:
            with self.subTest(f"{module}.{old}"):
                m = importlib.import_module(module)
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    value = getattr(m, old)
                self.assertIs(value, getattr(m, new))
                self.assertEqual([w.category for w in seen], [DeprecationWarning])
                self.assertIn(f"use {new}", str(seen[0].message))

    def test_from_import_of_an_old_name_warns(self) -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from cuda_ipc import TensorSet  # noqa: F401
        # (import may look the name up twice: once to ask whether it is a submodule)
        self.assertTrue(seen)
        self.assertEqual({w.category for w in seen}, {DeprecationWarning})

    def test_unknown_names_still_raise(self) -> None:
        import cuda_ipc
        with self.assertRaises(AttributeError):
            getattr(cuda_ipc, "NoSuchThing")
        with self.assertRaises(AttributeError):  # an old name a module never had
            getattr(importlib.import_module("cuda_ipc.descriptor"), "TensorSet")

    def test_new_names_are_exported(self) -> None:
        import cuda_ipc
        for name in ("DeviceArray", "ChannelMessage", "ChannelSlot", "TensorMap", "parse_descriptor_json"):
            self.assertIn(name, cuda_ipc.__all__)
        for old in ("ArrayView", "Message", "Slot", "TensorSet", "descriptor_from_json"):
            self.assertNotIn(old, cuda_ipc.__all__)


if __name__ == "__main__":
    unittest.main()


class MovedModuleTest(unittest.TestCase):
    """The old module paths of issue 36's moves still import, warn, and give the module at its new path."""

    def test_every_old_path_gives_the_new_module_with_a_warning(self) -> None:
        import sys
        from cuda_ipc._renamed import RENAMED_MODULES
        self.assertGreater(len(RENAMED_MODULES), 40)
        for old, new in RENAMED_MODULES.items():
            with self.subTest(old):
                sys.modules.pop(old, None)
                parent = old.rsplit(".", 1)[0]
                with warnings.catch_warnings():  # a split parent (cuda_ipc.memory) warns for itself: first
                    warnings.simplefilter("ignore")
                    importlib.import_module(parent)
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    module = importlib.import_module(old)
                self.assertIs(module, importlib.import_module(new))
                self.assertEqual(module.__name__, new)
                self.assertEqual([w.category for w in seen], [DeprecationWarning])
                self.assertIn(f"use {new}", str(seen[0].message))

    def test_from_imports_of_old_paths(self) -> None:
        import sys
        for old in ("cuda_ipc.tensor_set", "cuda_ipc.link.fanout"):
            sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            from cuda_ipc.tensor_set import share_tensors
            from cuda_ipc.link.fanout import Fanout
            from cuda_ipc import update
        import cuda_ipc
        self.assertIs(share_tensors, cuda_ipc.share_tensors)
        self.assertIs(Fanout, cuda_ipc.Fanout)
        self.assertIs(update.update_in_place, cuda_ipc.update_in_place)

    def test_a_path_that_never_existed_is_still_missing(self) -> None:
        with self.assertRaises(ModuleNotFoundError):
            importlib.import_module("cuda_ipc.link.no_such_module")


class SplitPackageTest(unittest.TestCase):
    """cuda_ipc.memory went to ipc/ and arrays/ (issue 36): the old package still imports, warns once,
    and gives each name it exported as the object at its new place, its submodules too."""

    def test_the_old_package_gives_every_name_from_its_new_module(self) -> None:
        import sys
        from cuda_ipc._renamed import RENAMED_PACKAGES
        for old, names in RENAMED_PACKAGES.items():
            for m in [k for k in sys.modules if k == old or k.startswith(old + ".")]:
                sys.modules.pop(m)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                package = importlib.import_module(old)
            self.assertEqual([w.category for w in seen], [DeprecationWarning])
            self.assertIn("cuda_ipc.ipc.cache", str(seen[0].message))
            for name, where in names.items():
                with self.subTest(f"{old}.{name}"):
                    self.assertIs(getattr(package, name), getattr(importlib.import_module(where), name))
            with self.assertRaises(AttributeError):
                getattr(package, "NoSuchThing")

    def test_from_imports_of_the_old_package(self) -> None:
        import cuda_ipc
        from cuda_ipc.arrays import device_array, exports
        from cuda_ipc.ipc import cache
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            from cuda_ipc.memory import DeviceBuffer, share, IpcEvent, ImportedPool  # noqa: F401
            from cuda_ipc.memory import cache as old_cache
            from cuda_ipc.memory.buffer import DeviceArray
        self.assertIs(DeviceBuffer, cuda_ipc.DeviceBuffer)
        self.assertIs(share, exports.share)
        self.assertIs(old_cache, cache)
        self.assertIs(DeviceArray, device_array.DeviceArray)
        self.assertEqual(cache.__spec__.name, "cuda_ipc.ipc.cache")  # the module keeps its own spec

    def test_old_modules_that_became_packages_keep_their_names(self) -> None:
        from cuda_ipc import host, native
        from cuda_ipc.host import host_buffer
        from cuda_ipc.native import addon
        for name in ("HostBuffer", "host_address"):
            self.assertIs(getattr(host, name), getattr(host_buffer, name))
        for name in ("NativeHelper", "native_helper", "library", "LIBRARY_NAME", "ABI_VERSION", "in_npm_package"):
            self.assertIs(getattr(native, name), getattr(addon, name))
