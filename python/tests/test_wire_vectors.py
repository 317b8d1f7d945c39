"""Wire conformance vectors (test/vectors/ of the repository, made by scripts/gen-wire-vectors.mjs with
Node's encoders): every recorded frame and record decodes, with this package's decoders, to the value
recorded beside it, and that value encodes, with this package's encoders, to the same bytes. Node's
test/cpu/wire-vectors.test.ts does the same with Node's: one set of bytes for both implementations.

The values are plain JSON: bytes as hex, a HostBuffer received in a host-bytes record as
{"$host-bytes": hex}, raw message bytes as {"$bytes": hex}."""
from __future__ import annotations

import json
import struct
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from cuda_ipc import HostBuffer, IpcError
from cuda_ipc import link as _link  # noqa: F401  (registers the transfer handlers, host-bytes among them)
from cuda_ipc.ipc.descriptor import decode_descriptor, descriptor_to_json, encode_descriptor, parse_descriptor_json
from cuda_ipc.link.messages.message_decoder import decode_message
from cuda_ipc.link.messages.message_encoder import encode_message
from cuda_ipc.link.messages.nccl_records import CommReference, decode_nccl_buffer, encode_nccl_buffer
from cuda_ipc.tensors.nccl_wire import decode_nccl_tensor_set, encode_nccl_tensor_set, encode_packed_table
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.channel.layout import read_header
from cuda_ipc.tensors.wire import decode_table, encode_set, encode_table, parse_set
from cuda_ipc.tensors.sharded import decode_layout, encode_layout
from cuda_ipc.tensors.sharded.errors import Box
from cuda_ipc.tensors.sharded.layout import GlobalTensor, LocalTensor, Piece, RankLayout

VECTORS = Path(__file__).resolve().parents[2] / "test" / "vectors"
ENCODINGS = ["json", "raw", "json-with-records"]
#: What the transfer handlers get as the link: a stand-in with what they ask of one.
LINK: Any = SimpleNamespace(transport="tcp", max_message_bytes=2**30)

Json = Any


def _header(b: bytes, fds: int = 0) -> tuple[int, int, int]:
    return fr.parse_header(memoryview(b), len(b), fds)


def _comm_json(c: CommReference) -> Json:
    return {"id": c.id.hex(), "nranks": c.nranks, "rank": c.rank, "broadcast": c.broadcast,
            "uniqueId": c.unique_id.hex() if c.unique_id is not None else None}


def _comm_of(j: Json) -> CommReference:
    return CommReference(bytes.fromhex(j["id"]), j["nranks"], j["rank"], j["broadcast"],
                         None if j["uniqueId"] is None else bytes.fromhex(j["uniqueId"]))


def _message_json(v: Any) -> Json:
    if isinstance(v, HostBuffer):
        r = {"$host-bytes": v.read().hex()}
        v.close()
        return r
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    if isinstance(v, list):
        return [_message_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _message_json(x) for k, x in v.items()}
    return v


def _message_value(j: Json, made: list[HostBuffer]) -> Any:
    if isinstance(j, dict) and isinstance(j.get("$host-bytes"), str):
        data = bytes.fromhex(j["$host-bytes"])
        b = HostBuffer.allocate(len(data))
        b.write(data)
        made.append(b)
        return b
    if isinstance(j, list):
        return [_message_value(x, made) for x in j]
    if isinstance(j, dict):
        return {k: _message_value(x, made) for k, x in j.items()}
    return j


def _encode_message(v: Json) -> bytes:
    made: list[HostBuffer] = []
    try:
        value = bytes.fromhex(v["value"]["$bytes"]) if v["encoding"] == "raw" else _message_value(v["value"], made)
        out = encode_message(value, SimpleNamespace(transport=v["transport"], max_message_bytes=2**30))  # type: ignore[arg-type]
        assert not out.fds
        return bytes(out.frame)
    finally:
        for b in made:
            b.close()


def _decode_message(b: bytes, _fds: int) -> Json:
    _, flags, n = _header(b)
    encoding = flags & fr.ENCODING_MASK
    transport = "tcp" if encoding == fr.ENC_JSON_WITH_RECORDS else "unix"
    value, _owned = decode_message(encoding, memoryview(b)[fr.HEADER_BYTES:fr.HEADER_BYTES + n], [],
                                   SimpleNamespace(transport=transport, max_message_bytes=2**30), None, [])  # type: ignore[arg-type]
    value = {"$bytes": bytes(value).hex()} if encoding == fr.ENC_RAW else _message_json(value)
    return {"encoding": ENCODINGS[encoding], "transport": transport, "value": value}


def _decode_refuse(b: bytes, _fds: int) -> Json:
    _, _, n = _header(b)
    (reason,) = struct.unpack_from("<H", b, fr.HEADER_BYTES)
    return {"reason": reason, "text": b[fr.HEADER_BYTES + 2:fr.HEADER_BYTES + n].decode("utf-8", "replace")}


def _decode_nccl_abort(b: bytes, _fds: int) -> Json:
    _, _, n = _header(b)
    comm, reason, text = fr.read_nccl_abort(b, n)
    return {"communicator": comm.hex(), "reason": reason, "text": text}


def _decode_nccl_buffer(b: bytes, _fds: int) -> Json:
    r = decode_nccl_buffer(memoryview(b))
    return {"comm": _comm_json(r.comm), "sequence": r.sequence, "byteLength": r.nbytes, "deviceUuid": r.device_uuid.hex(),
            "array": {"dtype": r.array[0], "shape": list(r.array[1])} if r.array is not None else None}


def _encode_nccl_buffer(v: Json) -> bytes:
    array = (v["array"]["dtype"], v["array"]["shape"]) if v["array"] is not None else None
    return encode_nccl_buffer(_comm_of(v["comm"]), v["sequence"], v["byteLength"], bytes.fromhex(v["deviceUuid"]), array)


def _decode_nccl_tensor_set(b: bytes, _fds: int) -> Json:
    r = decode_nccl_tensor_set(memoryview(b))
    L = r.layout
    return {"comm": _comm_json(r.comm), "sequence": r.sequence, "packedLength": r.packed_length, "chunkBytes": r.chunk_bytes,
            "tensors": [{"name": L.names[i], "dtype": L.dtypes[i], "shape": list(L.shapes[i]), "offset": L.offsets[i]} for i in range(L.count)]}


def _encode_nccl_tensor_set(v: Json) -> bytes:
    t = v["tensors"]
    table = encode_packed_table([x["name"] for x in t], [x["dtype"] for x in t], [x["shape"] for x in t], [x["offset"] for x in t])
    return encode_nccl_tensor_set(_comm_of(v["comm"]), v["sequence"], table, len(t), v["packedLength"], v["chunkBytes"])


def _decode_tensor_set(b: bytes, fds: int) -> Json:
    entries, table, count = parse_set(memoryview(b), fds)
    L = decode_table(bytes(table), count, [e[3] for e in entries])
    return {"allocations": [{"kind": e[0], "fdCount": e[1], "data": bytes(e[2]).hex()} for e in entries],
            "tensors": [{"name": L.names[i], "dtype": L.dtypes[i], "shape": list(L.shapes[i]), "strides": list(L.strides[i]),
                         "offset": L.offsets[i], "allocation": L.allocations[i]} for i in range(L.count)]}


def _encode_tensor_set(v: Json) -> bytes:
    t = v["tensors"]
    table = encode_table([x["name"] for x in t], [x["dtype"] for x in t], [x["shape"] for x in t], [x["strides"] for x in t],
                         [x["offset"] for x in t], [x["allocation"] for x in t], len(v["allocations"]))
    return encode_set([(a["kind"], a["fdCount"], bytes.fromhex(a["data"])) for a in v["allocations"]], table, len(t))


def _large(v: Json) -> bytes:
    return fr.header(fr.MESSAGE, ENCODINGS.index(v["encoding"]) | fr.LARGE_PAYLOAD, 8, 1) + struct.pack("<Q", v["length"])


def _decode_large(b: bytes, _fds: int) -> Json:
    _, flags, _ = _header(b, 1)
    return {"encoding": ENCODINGS[flags & fr.ENCODING_MASK], "length": struct.unpack_from("<Q", b, fr.HEADER_BYTES)[0]}


def _decode_gone(b: bytes, _fds: int) -> Json:
    _, _, n = _header(b)
    return {"entries": [{"kind": k, "key": key.hex()} for k, key in fr.read_gone_entries(b, n)]}


def _decode_release(b: bytes, _fds: int) -> Json:
    _, _, n = _header(b)
    return {"ids": fr.read_release_ids(b, n)}


def _decode_control_block(b: bytes, _fds: int) -> Json:
    L = read_header(memoryview(b), len(b))
    return {"slotCount": L.slot_count, "slotBytes": L.slot_bytes, "metaBytes": L.meta_bytes, "maxParticipants": L.max_participants,
            "device": L.device, "broadcast": L.broadcast, "expectProducers": L.expect_producers, "expectConsumers": L.expect_consumers,
            "participantsOffset": L.participants_offset, "ringOffset": L.ring_offset, "slotRecordsOffset": L.slot_records_offset,
            "slotRecordBytes": L.slot_record_bytes, "fencesOffset": L.fences_offset, "totalBytes": L.total_bytes}


def _local_json(t: LocalTensor) -> Json:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "strides": list(t.strides),
            "pieces": [{"tensor": p.tensor, "start": list(p.start), "length": list(p.length), "at": list(p.at)} for p in t.pieces],
            "padding": [{"start": list(b.start), "length": list(b.length)} for b in t.padding]}


def _decode_layout(b: bytes, _fds: int) -> Json:
    lay = decode_layout(b)
    return {"rank": lay.rank, "node": lay.node, "gpu": lay.gpu,
            "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in lay.tensors],
            "sources": [_local_json(t) for t in lay.sources], "destinations": [_local_json(t) for t in lay.destinations]}


def _local_of(j: Json) -> LocalTensor:
    return LocalTensor(j["name"], j["dtype"], tuple(j["shape"]), tuple(j["strides"]),
                       tuple(Piece(p["tensor"], tuple(p["start"]), tuple(p["length"]), tuple(p["at"])) for p in j["pieces"]),
                       tuple(Box(tuple(b["start"]), tuple(b["length"])) for b in j["padding"]))


def _encode_layout(v: Json) -> bytes:
    return encode_layout(RankLayout(v["rank"], v["node"], v["gpu"],
                                    tuple(GlobalTensor(t["name"], t["dtype"], tuple(t["shape"])) for t in v["tensors"]),
                                    tuple(_local_of(t) for t in v["sources"]), tuple(_local_of(t) for t in v["destinations"])))


#: kind -> (decode(bytes, fds), encode(value) or None where Python never writes that frame)
CODECS: dict[str, tuple[Callable[[bytes, int], Json], Callable[[Json], bytes] | None]] = {
    "frame-hello": (lambda b, _f: (_header(b), {"features": fr.hello_features(b)})[1], lambda v: fr.hello_frame(v["features"])),
    "frame-goodbye": (lambda b, _f: (_header(b), {})[1], lambda _v: fr.goodbye_frame()),
    "frame-refuse": (_decode_refuse, lambda v: fr.refuse_frame(v["reason"], v["text"])),
    "frame-release": (_decode_release, lambda v: fr.release_frame(v["ids"])),
    # Python reads GONE frames and never sends one (its memory is freed by its own refcounts).
    "frame-gone": (_decode_gone, None),
    "frame-nccl-abort": (_decode_nccl_abort, lambda v: fr.nccl_abort_frame(bytes.fromhex(v["communicator"]), v["reason"], v["text"].encode())),
    "frame-message": (_decode_message, _encode_message),
    "frame-large-message": (_decode_large, _large),
    "descriptor": (lambda b, _f: descriptor_to_json(decode_descriptor(b)), lambda v: encode_descriptor(parse_descriptor_json(v))),
    "nccl-buffer": (_decode_nccl_buffer, _encode_nccl_buffer),
    "nccl-tensor-set": (_decode_nccl_tensor_set, _encode_nccl_tensor_set),
    "tensor-set": (_decode_tensor_set, _encode_tensor_set),
    # Python joins channels and never makes one: it reads control blocks (Node's hub writes them).
    "channel-control-block": (_decode_control_block, None),
    "sharded-layout": (_decode_layout, _encode_layout),
}


def _vectors() -> list[tuple[str, Json, bytes]]:
    out = []
    for f in sorted(VECTORS.glob("*.json")):
        meta = json.loads(f.read_text("utf-8"))
        out.append((f.stem, meta, bytes.fromhex("".join(f.with_suffix(".hex").read_text("ascii").split()))))
    return out


@unittest.skipUnless(VECTORS.is_dir(), f"no {VECTORS} (the vectors live in the repository, not in the installed package)")
class WireVectorTests(unittest.TestCase):
    def test_the_vectors_are_there(self) -> None:
        vectors = _vectors()
        self.assertGreaterEqual(len(vectors), 23)
        self.assertEqual({m["kind"] for _, m, _ in vectors} - set(CODECS), set(), "a kind this test cannot read: add its codec")

    def test_every_vector_decodes_to_its_value_and_encodes_to_its_bytes(self) -> None:
        for name, meta, data in _vectors():
            with self.subTest(name):
                decode, encode = CODECS[meta["kind"]]
                self.assertEqual(decode(data, meta.get("fds", 0)), meta["value"])
                if encode is not None:
                    self.assertEqual(encode(meta["value"]).hex(), data.hex())

    def test_a_changed_magic_is_refused(self) -> None:
        name, meta, data = next(v for v in _vectors() if v[0] == "release-many")
        bad = bytes([data[0] ^ 0xFF]) + data[1:]
        with self.assertRaises(IpcError) as e:
            CODECS[meta["kind"]][0](bad, 0)
        self.assertEqual(e.exception.code, "ERR_FRAME_INVALID")


if __name__ == "__main__":
    unittest.main()
