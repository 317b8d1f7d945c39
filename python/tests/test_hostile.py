"""A hostile peer against a Python receiver: host-buffer records whose fd is not a sealed memfd, or
smaller than announced, are refused before anything maps them (ERR_DESCRIPTOR_INVALID, no SIGBUS);
the link goes on serving, and no fd is left behind. (The Node receiver's suite: test/cpu/hostile.test.ts.)"""
import fcntl
import gc
import os
import socket
import struct
import tempfile
import unittest

from cuda_ipc import IpcError
from cuda_ipc.link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler

from .test_link import open_fds, pair


class _Raw:
    """A value whose record the test writes by hand: kind host-buffer, any fd, any sizes."""

    def __init__(self, fd: int, file_length: int, offset: int = 0, length: int | None = None):
        self.fd, self.file_length, self.offset = fd, file_length, offset
        self.length = file_length if length is None else length


class _RawHostBuffer(TransferHandler[_Raw]):
    kind = "raw-host-buffer-test"

    def can_transfer(self, value: object) -> bool:
        return isinstance(value, _Raw)

    def encode(self, value: _Raw, link: object) -> TransferEncoding:
        return TransferEncoding(data=struct.pack("<QQQ", value.file_length, value.offset, value.length), fds=[value.fd], kind="host-buffer")

    def decode(self, data: memoryview, fds: list[int], link: object, lease: object) -> _Raw:
        raise AssertionError("never received")


def memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


class HostileHostBufferTests(unittest.TestCase):
    def setUp(self):
        register_transfer_handler(_RawHostBuffer())
        self.fds = open_fds()

    def tearDown(self):
        unregister_transfer_handler(_RawHostBuffer.kind)
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_each_odd_fd_is_refused_and_the_link_goes_on(self):
        size_seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
        tmp = tempfile.TemporaryFile()
        tmp.truncate(4096)
        r, w = os.pipe()
        s1, s2 = socket.socketpair()
        directory = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        zero = os.open("/dev/zero", os.O_RDWR)
        cases = {
            "a regular file": (tmp.fileno(), 4096),
            "a pipe": (r, 4096),
            "a socket": (s1.fileno(), 4096),
            "a directory": (directory, 4096),
            "/dev/zero": (zero, 4096),
            "an unsealed memfd": (memfd(4096, 0), 4096),
            "a memfd sealed against writes": (memfd(4096, size_seals | fcntl.F_SEAL_WRITE), 4096),
            "a sealed memfd smaller than declared": (memfd(4096, size_seals), 1 << 20),
        }
        la, lb = pair()
        try:
            for name, (fd, declared) in cases.items():
                with self.subTest(name):
                    la.send({"buffer": _Raw(fd, declared)})
                    with self.assertRaises(IpcError) as cm:
                        lb.receive(timeout=5)
                    self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_INVALID", name)
                    la.send({"honest": name})
                    self.assertEqual(lb.receive(timeout=5), {"honest": name}, "the same link serves an honest message next")
        finally:
            la.close()
            lb.close()
            for fd in (cases["an unsealed memfd"][0], cases["a memfd sealed against writes"][0], cases["a sealed memfd smaller than declared"][0], r, w, directory, zero):
                os.close(fd)
            s1.close()
            s2.close()
            tmp.close()


if __name__ == "__main__":
    unittest.main()
