"""The 'tensor-set' record's table (docs/PROTOCOL.md section 4.2; cuda_ipc/tensors/wire.py, Node's
src/tensors/wire.ts): what it encodes, and every lie of a peer's table refused with a typed error.
Split from test_tensor_set.py (a file of its own per layer, none over 600 lines)."""
import struct
import unittest

from cuda_ipc import IpcError
from cuda_ipc.tensors.wire import KIND_HOST, decode_table, encode_set, encode_table, parse_set


class WireTests(unittest.TestCase):
    SPECS = (["layer.0.weight", "layer.0.bias", "layer.1.weight.T"], ["float32", "float32", "bfloat16"],
             [(4, 8), (8,), (8, 4)], [(32, 4), (4,), (2, 16)], [0, 128, 0], [0, 0, 1])

    def record(self, sizes=(256, 64)):
        table = encode_table(*self.SPECS, len(sizes))
        entries = [(KIND_HOST, 1, struct.pack("<QQQ", s, 0, s)) for s in sizes]
        return encode_set(entries, table, 3)

    def decode(self, data, fds=2):
        allocs, table, count = parse_set(memoryview(data), fds)
        return decode_table(table, count, [a[3] for a in allocs])

    def test_round_trip_and_front_coding(self):
        L = self.decode(self.record())
        self.assertEqual(L.names, self.SPECS[0])
        self.assertEqual(L.shapes, self.SPECS[2])
        self.assertEqual(L.strides, [(32, 4), (4,), (2, 16)])
        self.assertEqual((L.offsets, L.extents, L.contiguous), ([0, 128, 0], [128, 32, 64], [True, True, False]))
        table = encode_table(*self.SPECS, 2)
        self.assertEqual(struct.unpack_from("<H", table, 12 * 3 + 2)[0], len("layer.0."))
        self.assertEqual(len(table) % 8, 0)

    def test_every_lie_is_frame_invalid_naming_what_is_wrong(self):
        good = self.record()
        T = 3
        table_at = len(good) - len(encode_table(*self.SPECS, 2))

        def bad(mutate, fragment, fds=2):
            b = bytearray(good)
            mutate(b)
            with self.assertRaises(IpcError) as cm:
                self.decode(bytes(b), fds)
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            self.assertRegex(str(cm.exception), fragment)

        bad(lambda b: b.__setitem__(0, 0), "bad magic")
        bad(lambda b: struct.pack_into("<H", b, 4, 2), "version 2")
        bad(lambda b: b.__setitem__(25, 1), "reserved")
        bad(lambda b: None, "claim 2 fds but the record has 1", fds=1)
        bad(lambda b: b.__setitem__(32, 9), "unknown kind 9")
        bad(lambda b: b.__setitem__(33, 0), "claims 0 fds where it must carry 1")
        bad(lambda b: struct.pack_into("<Q", b, 48, 4), "does not describe one whole allocation")
        bad(lambda b: struct.pack_into("<I", b, 16, 8), "does not end the record")
        bad(lambda b: struct.pack_into("<Q", b, table_at + 8, 240), "'layer.0.bias' reaches byte 272 of its allocation, which holds 256")
        bad(lambda b: struct.pack_into("<Q", b, table_at + 8, 230), "'layer.0.bias' starts at offset 230, not a multiple of its 4-byte elements")
        bad(lambda b: struct.pack_into("<I", b, table_at + 8 * T + 4, 5), "'layer.0.bias' names allocation 5 of 2")
        bad(lambda b: struct.pack_into("<I", b, table_at + 8 * T + 8, 0), "allocation 1 holds no tensor")
        bad(lambda b: b.__setitem__(table_at + 16 * T + 1, 99), "'layer.0.bias' has unknown dtype code 99")
        bad(lambda b: b.__setitem__(table_at + 17 * T, 33), "33 dimensions")
        bad(lambda b: b.__setitem__(table_at + 18 * T, 2), "unknown flags 2")
        bad(lambda b: b.__setitem__(table_at + 18 * T, 1), "should hold")
        bad(lambda b: struct.pack_into("<H", b, table_at + 12 * T + 2, 99), "shares 99 name bytes with a previous name of 14")
        bad(lambda b: b.__setitem__(table_at + 19 * T, 1), "padding bytes are not zero")
        bad(lambda b: b.__setitem__(len(b) - 1, 1), "padding bytes are not zero")
        shape_at = table_at + ((19 * T + 7) & ~7)
        bad(lambda b: struct.pack_into("<Q", b, shape_at, 0), "'layer.0.weight' has dimension 0 of 0 elements")
        strides_at = shape_at + 8 * 5  # the explicit strides of 'layer.1.weight.T' (2, 16), after 5 dimensions
        bad(lambda b: struct.pack_into("<Q", b, strides_at, 3), "'layer.1.weight.T' has stride 3 in dimension 0, not a non-negative multiple of 2")
        bad(lambda b: struct.pack_into("<QQ", b, strides_at, 8, 2), "'layer.1.weight.T' carries explicit strides equal to the C-contiguous ones")

    def test_the_same_bytes_as_node(self):
        # Pinned against src/tensors/wire.ts (test/cpu/python-tensors.test.ts sends sets both ways).
        table = encode_table(["ab", "ac"], ["uint8", "uint8"], [(4,), (2, 2)], [(1,), (1, 2)], [0, 4], [0, 0], 1)
        self.assertEqual(table.hex(), (
            "0000000000000000" "0400000000000000"  # offsets
            "00000000" "00000000"  # allocations
            "0000" "0100"  # shared
            "0200" "0100"  # suffix
            "0505" "0102" "0001"  # dtype codes, ranks, flags
            "0000"  # padding to 8
            "0400000000000000" "0200000000000000" "0200000000000000"  # shapes
            "0100000000000000" "0200000000000000"  # strides of the second (not C order)
            "616263" "0000000000"))  # names 'ab' + 'c', padding


if __name__ == "__main__":
    unittest.main()
