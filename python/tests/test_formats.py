"""Descriptors (binary and JSON), PyTorch's handle format, DLPack capsules: no GPU needed."""
import ctypes
import gc
import json
import os
import unittest
import weakref

from cuda_ipc import HostBuffer, IpcError, descriptor_from_torch, torch_storage_args
from cuda_ipc import dlpack
from cuda_ipc.ipc.descriptor import (
    ArrayMeta, IpcEventDescriptor, LegacyHandleDescriptor, decode_descriptor, parse_descriptor_json, descriptor_to_json,
    dtype_name, encode_descriptor,
)
from cuda_ipc.ipc.torch_handle import split_torch_handle, torch_handle

UUID = "GPU-0123abcd-4567-89ab-cdef-0123456789ab"
HANDLE = bytes(range(64))


class DescriptorTests(unittest.TestCase):
    def test_binary_round_trip(self):
        for array in (None, ArrayMeta.make("float32", (2, 3)), ArrayMeta.make("bfloat16", (4, 2), (8, 2)), ArrayMeta.make("<i8", (5,))):
            d = LegacyHandleDescriptor(HANDLE, 4096, 1024, UUID, 1234, array)
            b = encode_descriptor(d)
            self.assertEqual(len(b), 128 + 16 * (len(array.shape) if array else 0))
            self.assertEqual(decode_descriptor(b), d)
            self.assertEqual(parse_descriptor_json(json.dumps(descriptor_to_json(d))), d)
        e = IpcEventDescriptor(HANDLE, UUID, 99)
        self.assertEqual(len(encode_descriptor(e)), 104)
        self.assertEqual(decode_descriptor(encode_descriptor(e)), e)
        self.assertEqual(parse_descriptor_json(descriptor_to_json(e)), e)

    def test_strict_decoding(self):
        good = encode_descriptor(LegacyHandleDescriptor(HANDLE, 0, 64, UUID, 1, ArrayMeta.make("uint8", (64,))))
        for name, bad, code in (
            ("magic", b"XIPC" + good[4:], "ERR_DESCRIPTOR_INVALID"),
            ("version", good[:4] + b"\x02" + good[5:], "ERR_DESCRIPTOR_VERSION"),
            ("kind", good[:6] + b"\x07" + good[7:], "ERR_DESCRIPTOR_KIND"),
            ("cut", good[:-1], "ERR_DESCRIPTOR_INVALID"),
            ("padded", good + b"\x00", "ERR_DESCRIPTOR_INVALID"),
            ("reserved", good[:12] + b"\x01" + good[13:], "ERR_DESCRIPTOR_INVALID"),
            ("extent", good[:104] + (10).to_bytes(8, "little") + good[112:], "ERR_DESCRIPTOR_INVALID"),
            ("pid 0", good[:112] + bytes(4) + good[116:], "ERR_DESCRIPTOR_INVALID"),
        ):
            with self.subTest(name):
                with self.assertRaises(IpcError) as cm:
                    decode_descriptor(bad)
                self.assertEqual(cm.exception.code, code)
        with self.assertRaises(IpcError) as cm:
            decode_descriptor(good, "cuda-ipc-event")
        self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_KIND")

    def test_json_hints_at_the_torch_handle(self):
        j = descriptor_to_json(LegacyHandleDescriptor(HANDLE, 0, 64, UUID, 1))
        j["handle"] = "0263" + j["handle"]
        with self.assertRaises(IpcError) as cm:
            parse_descriptor_json(j)
        self.assertIn("descriptor_from_torch", str(cm.exception))
        j = descriptor_to_json(LegacyHandleDescriptor(HANDLE, 0, 64, UUID, 1))
        j["extra"] = 1
        with self.assertRaises(IpcError):
            parse_descriptor_json(j)

    def test_dtype_names(self):
        self.assertEqual(dtype_name("<f4"), "float32")
        self.assertEqual(dtype_name("torch.bfloat16"), "bfloat16")
        self.assertEqual(dtype_name("|u1"), "uint8")
        with self.assertRaises(IpcError):
            dtype_name("complex64")


class TorchHandleTests(unittest.TestCase):
    def share_tuple(self, version=2, kind=b"c", size=4096, offset=512):
        # The shape _share_cuda_() returns (seen on the GPU machine with torch 2.11).
        return (0, bytes([version]) + kind + HANDLE, size, offset, b"/torch_123_456_0", 0, bytes(64), True)

    def test_descriptor_from_torch_adds_the_storage_offset(self):
        d = descriptor_from_torch(self.share_tuple(), UUID, pid=77)
        self.assertEqual((d.handle, d.offset, d.byte_length, d.pid), (HANDLE, 512, 4096, 77))
        # A view 12 bytes into the storage (storage_offset 3 of float32).
        d = descriptor_from_torch(self.share_tuple(), UUID, byte_offset=12, array=ArrayMeta.make("float32", (10,)))
        self.assertEqual((d.offset, d.byte_length, d.pid), (524, 4084, os.getpid()))
        self.assertEqual(descriptor_from_torch(self.share_tuple(version=3), UUID).handle, HANDLE)

    def test_bad_torch_handles(self):
        with self.assertRaises(IpcError) as cm:
            descriptor_from_torch(self.share_tuple(kind=b"e"), UUID)
        self.assertEqual(cm.exception.code, "ERR_NOT_EXPORTABLE")
        self.assertIn("expandable", str(cm.exception))
        with self.assertRaises(IpcError):
            split_torch_handle(b"\x02c" + HANDLE[:10])
        with self.assertRaises(IpcError):
            descriptor_from_torch(self.share_tuple(), UUID, byte_offset=5000)

    def test_torch_storage_args_round_trip(self):
        d = LegacyHandleDescriptor(HANDLE, 2048, 400, UUID, 5)
        args = torch_storage_args(d, 0)
        self.assertEqual(len(args), 8)
        self.assertEqual(args[1], torch_handle(d))
        self.assertEqual(args[1][:2], b"\x02c")
        self.assertEqual((args[2], args[3], args[7]), (400, 2048, False))
        self.assertEqual(descriptor_from_torch(args, UUID, pid=5), d)


class DLPackTests(unittest.TestCase):
    PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
    PyCapsule_IsValid.restype = ctypes.c_int
    PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
    PyCapsule_GetPointer.restype = ctypes.c_void_p
    PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    PyCapsule_SetName = ctypes.pythonapi.PyCapsule_SetName
    PyCapsule_SetName.restype = ctypes.c_int
    PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

    def test_an_unconsumed_capsule_releases_its_owner(self):
        hb = HostBuffer.allocate(4096)
        before = dlpack.live_tensors()
        cap = hb.__dlpack__()
        self.assertTrue(self.PyCapsule_IsValid(cap, b"dltensor"))
        self.assertEqual(hb.__dlpack_device__(), (dlpack.DL_CPU, 0))
        self.assertEqual(dlpack.live_tensors(), before + 1)
        del cap
        gc.collect()
        self.assertEqual(dlpack.live_tensors(), before)
        hb.close()
        self.assertTrue(hb._mapping.unmapped or hb._mapping.users == 0)

    def test_a_consumer_sees_the_memory_and_its_deleter_releases_it(self):
        hb = HostBuffer.allocate(64)
        hb.write(bytes(range(64)))
        mapping = weakref.ref(hb._mapping.mmap)
        cap = hb.__dlpack__()
        # What a consumer does: take the pointer, rename the capsule, call the deleter when done.
        ptr = self.PyCapsule_GetPointer(cap, b"dltensor")
        self.assertEqual(self.PyCapsule_SetName(cap, b"used_dltensor"), 0)
        managed = ctypes.cast(ptr, ctypes.POINTER(dlpack.DLManagedTensor)).contents
        t = managed.dl_tensor
        shape = ctypes.c_int64.from_address(t.shape).value
        self.assertEqual((t.device.device_type, t.ndim, t.dtype.code, t.dtype.bits, shape), (dlpack.DL_CPU, 1, 1, 8, 64))
        self.assertFalse(bool(t.strides))
        self.assertEqual(ctypes.string_at(t.data, 4), bytes([0, 1, 2, 3]))
        del cap
        gc.collect()
        hb.close()
        self.assertIsNotNone(mapping(), "the consumer still holds the memory")
        managed.deleter(ctypes.cast(ptr, ctypes.POINTER(dlpack.DLManagedTensor)))
        del managed, t
        gc.collect()
        self.assertIsNone(mapping(), "the deleter let go of the last reference: unmapped")

    def test_dtypes_and_strides(self):
        self.assertEqual((dlpack.dl_dtype("<V2").code, dlpack.dl_dtype("<V2").bits), (4, 16))
        self.assertEqual((dlpack.dl_dtype("<f4").code, dlpack.dl_dtype("<i8").code, dlpack.dl_dtype("|u1").code), (2, 0, 1))
        with self.assertRaises(BufferError):
            dlpack.dl_dtype("<c8")
        cap = dlpack.make_capsule(0x1000, (dlpack.DL_CUDA, 0), "<f4", (2, 3), (4, 8), owner=None)
        ptr = self.PyCapsule_GetPointer(cap, b"dltensor")
        t = ctypes.cast(ptr, ctypes.POINTER(dlpack.DLManagedTensor)).contents.dl_tensor
        strides = (ctypes.c_int64 * 2).from_address(t.strides)
        shape = (ctypes.c_int64 * 2).from_address(t.shape)
        self.assertEqual((strides[0], strides[1], shape[0], shape[1]), (1, 2, 2, 3))
        del strides, shape
        del cap, t
        gc.collect()


if __name__ == "__main__":
    unittest.main()
