// Every check of a frame header (parseHeader) and of the GONE and RELEASE payloads at its bound
// (issue 41's mutation testing): one byte or unit past what is valid is ERR_FRAME_INVALID naming
// the field, the last valid value parses. link-frame.test.ts has the frames on real links.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  FrameType, Encoding, HEADER_BYTES, LARGE_PAYLOAD, MAX_GONE_KEY_BYTES, MAX_RELEASE_IDS, NCCL_ABORT_HEAD_BYTES, NCCL_ABORT_TEXT_MAX,
  parseHeader, readGoneEntries, readReleaseIds, readU64, writeHeader, type FrameHeader,
} from '../../src/link/transport/frame.js';

/** A frame: a header for `payload` (or `declared` bytes) and `fds`, then the payload. */
function frame(type: number, flags: number, payload: Uint8Array | number, fds = 0): Uint8Array {
  const body = typeof payload === 'number' ? new Uint8Array(payload) : payload;
  const out = new Uint8Array(HEADER_BYTES + body.byteLength);
  writeHeader(new DataView(out.buffer), type, flags, body.byteLength, fds);
  out.set(body, HEADER_BYTES);
  return out;
}
const view = (b: Uint8Array) => new DataView(b.buffer, b.byteOffset, b.byteLength);
const parse = (b: Uint8Array, fds = 0, length = b.byteLength): FrameHeader =>
  parseHeader(view(b), length, fds, { type: 0 as FrameType, flags: 0, payloadLength: 0, fdCount: 0 });
const invalid = (message: RegExp) => ({ code: 'ERR_FRAME_INVALID', message });
const refused = (b: Uint8Array, message: RegExp, fds = 0) => assert.throws(() => parse(b, fds), invalid(message));
/** `b` with the u32 at `at` set to `v`. */
const with32 = (b: Uint8Array, at: number, v: number) => { const c = b.slice(); view(c).setUint32(at, v, true); return c; };

test('the header: length, magic, version, reserved bytes, payload length and fds at their bounds', () => {
  const bare = frame(FrameType.Message, Encoding.Json, 0);
  assert.deepEqual(parse(bare), { type: FrameType.Message, flags: 0, payloadLength: 0, fdCount: 0 }, 'a bare header is a frame');
  assert.throws(() => parse(bare, 0, HEADER_BYTES - 1), invalid(/15 bytes is shorter than the 16-byte header/));
  refused(with32(bare, 0, 0x4c504942), /bad magic 0x4c504942/);
  for (const version of [1, 3]) { const b = bare.slice(); b[4] = version; refused(b, new RegExp(`protocol version ${version}, this build speaks 2`)); }
  for (const at of [14, 15]) { const b = bare.slice(); b[at] = 1; refused(b, /reserved header bytes are not zero/); }
  const two = frame(FrameType.Message, Encoding.Json, 2);
  assert.equal(parse(two).payloadLength, 2);
  assert.throws(() => parse(two, 0, two.byteLength + 1), invalid(/payload length 2 does not match the 3 bytes received/));
  assert.throws(() => parse(two, 0, two.byteLength - 1), invalid(/payload length 2 does not match the 1 bytes received/));
  const fds = frame(FrameType.Message, Encoding.JsonWithRecords, 2, 2);
  assert.equal(parse(fds, 2).fdCount, 2);
  refused(fds, /header announces 2 fds but 1 arrived/, 1);
  refused(fds, /header announces 2 fds but 3 arrived/, 3);
  for (const type of [0, 10, 255]) refused(frame(type, 0, 0), new RegExp(`unknown frame type ${type}`));
});

test('a message: flags, encoding, large payloads and record fds at their bounds', () => {
  assert.equal(parse(frame(FrameType.Message, Encoding.JsonWithRecords, 2)).flags, Encoding.JsonWithRecords);
  refused(frame(FrameType.Message, Encoding.JsonWithRecords + 1, 2), /unknown message encoding 3/);
  refused(frame(FrameType.Message, 0x200, 2), /unknown message flags 0x200/);
  refused(frame(FrameType.Message, 0x8000, 2), /unknown message flags 0x8000/);
  // Large: an 8-byte length and its memfd first.
  assert.equal(parse(frame(FrameType.Message, LARGE_PAYLOAD, 8, 1), 1).flags, LARGE_PAYLOAD);
  for (const n of [7, 9]) refused(frame(FrameType.Message, LARGE_PAYLOAD, n, 1), new RegExp(`must carry an 8-byte length and its memfd \\(got ${n} bytes, 1 fds\\)`), 1);
  refused(frame(FrameType.Message, LARGE_PAYLOAD, 8, 0), /got 8 bytes, 0 fds/);
  refused(frame(FrameType.Message, LARGE_PAYLOAD | Encoding.Json, 8, 2), /fds arrived with a message that has no transfer records/, 2);
  assert.equal(parse(frame(FrameType.Message, LARGE_PAYLOAD | Encoding.JsonWithRecords, 8, 2), 2).fdCount, 2);
  refused(frame(FrameType.Message, Encoding.Raw, 2, 1), /fds arrived with a message that has no transfer records/, 1);
  assert.equal(parse(frame(FrameType.Message, Encoding.JsonWithRecords, 2, 1), 1).fdCount, 1);
});

test('RING and NCCL_ABORT frames at their bounds', () => {
  const ring = frame(FrameType.Ring, 0, 8, 2);
  assert.equal(parse(ring, 2).type, FrameType.Ring);
  assert.equal(parse(with32(ring, HEADER_BYTES, 0xffff_ffff), 2).type, FrameType.Ring, 'the first word is free');
  refused(frame(FrameType.Ring, 1, 8, 2), /flags 0x1 on a control frame/, 2);
  for (const n of [7, 9]) refused(frame(FrameType.Ring, 0, n, 2), new RegExp(`RING payload of ${n} bytes`), 2);
  for (const f of [1, 3]) refused(frame(FrameType.Ring, 0, 8, f), new RegExp(`RING with ${f} fds, not 2`), f);
  refused(with32(ring, HEADER_BYTES + 4, 1), /RING reserved bytes are not zero/, 2);
  const abort = (n: number, reason = 1) => with32(frame(FrameType.NcclAbort, 0, n), HEADER_BYTES + 16, reason);
  for (const n of [NCCL_ABORT_HEAD_BYTES, NCCL_ABORT_HEAD_BYTES + NCCL_ABORT_TEXT_MAX]) assert.equal(parse(abort(n)).payloadLength, n);
  for (const n of [NCCL_ABORT_HEAD_BYTES - 1, NCCL_ABORT_HEAD_BYTES + NCCL_ABORT_TEXT_MAX + 1]) refused(abort(n), new RegExp(`NCCL_ABORT payload of ${n} bytes \\(24 to 1048\\)`));
  for (const reason of [1, 3]) assert.equal(parse(abort(24, reason)).type, FrameType.NcclAbort);
  for (const reason of [0, 4]) refused(abort(24, reason), new RegExp(`NCCL_ABORT reason ${reason} \\(1..3\\)`));
  refused(with32(abort(24), HEADER_BYTES + 20, 1), /NCCL_ABORT reserved bytes are not zero/);
  refused(frame(FrameType.NcclAbort, 2, 24), /flags 0x2 on a control frame/);
  refused(with32(frame(FrameType.NcclAbort, 0, 24, 1), HEADER_BYTES + 16, 1), /fds arrived with a control frame/, 1);
});

test('control frames: HELLO, GOODBYE, RING_START, REFUSE, RELEASE and GONE at their bounds', () => {
  for (const type of [FrameType.Hello, FrameType.Goodbye, FrameType.Refuse, FrameType.Release, FrameType.Gone, FrameType.RingStart]) {
    refused(frame(type, 1, 16), /flags 0x1 on a control frame/);
    refused(frame(type, 0, 16, 1), /fds arrived with a control frame/, 1);
  }
  assert.equal(parse(frame(FrameType.Hello, 0, 8)).type, FrameType.Hello);
  for (const n of [7, 9]) refused(frame(FrameType.Hello, 0, n), new RegExp(`HELLO payload of ${n} bytes`));
  refused(with32(frame(FrameType.Hello, 0, 8), HEADER_BYTES + 4, 1), /HELLO reserved bytes are not zero/);
  assert.equal(parse(frame(FrameType.Goodbye, 0, 0)).type, FrameType.Goodbye);
  refused(frame(FrameType.Goodbye, 0, 1), /GOODBYE with a payload/);
  assert.equal(parse(frame(FrameType.RingStart, 0, 0)).type, FrameType.RingStart);
  refused(frame(FrameType.RingStart, 0, 1), /RING_START with a payload/);
  assert.equal(parse(frame(FrameType.Refuse, 0, 2)).payloadLength, 2);
  refused(frame(FrameType.Refuse, 0, 1), /REFUSE without a reason/);
  // RELEASE: count ids of 8 bytes after an 8-byte head.
  const release = (count: number, ids = count) => with32(frame(FrameType.Release, 0, 8 + 8 * ids), HEADER_BYTES, count);
  assert.equal(parse(release(1)).payloadLength, 16);
  assert.equal(parse(release(MAX_RELEASE_IDS)).payloadLength, 8 + 8 * MAX_RELEASE_IDS, 'the most ids a frame holds');
  refused(release(MAX_RELEASE_IDS + 1), new RegExp(`announcing ${MAX_RELEASE_IDS + 1} ids`));
  refused(release(0), /RELEASE of 8 bytes announcing 0 ids/);
  refused(release(1, 0), /RELEASE of 8 bytes announcing 1 ids/, 0);
  refused(release(1, 2), /RELEASE of 24 bytes announcing 1 ids/);
  refused(release(2, 1), /RELEASE of 16 bytes announcing 2 ids/);
  refused(with32(frame(FrameType.Release, 0, 7), HEADER_BYTES, 1), /RELEASE of 7 bytes announcing 0 ids/, 0);
  refused(with32(release(1), HEADER_BYTES + 4, 1), /RELEASE reserved bytes are not zero/);
  // GONE: an 8-byte head (count, reserved), then the entries.
  const gone = (n: number, count: number) => with32(frame(FrameType.Gone, 0, n), HEADER_BYTES, count);
  assert.equal(parse(gone(8, 1)).type, FrameType.Gone);
  refused(gone(8, 0), /GONE of 8 bytes announcing no entries/);
  refused(with32(frame(FrameType.Gone, 0, 7), HEADER_BYTES, 1), /GONE of 7 bytes announcing no entries/);
  refused(with32(gone(8, 1), HEADER_BYTES + 4, 1), /GONE reserved bytes are not zero/);
});

/** A GONE frame's bytes holding `entries` (kind bytes, key length, key bytes) after its head. */
function goneFrame(entries: Array<{ kind: number[]; key: number }>, extra = 0, count = entries.length): Uint8Array {
  const body: number[] = [count & 0xff, (count >> 8) & 0xff, (count >> 16) & 0xff, count >>> 24, 0, 0, 0, 0];
  for (const e of entries) body.push(e.kind.length, ...e.kind, e.key & 0xff, e.key >> 8, ...new Array<number>(e.key).fill(7));
  body.push(...new Array<number>(extra).fill(0));
  return frame(FrameType.Gone, 0, Uint8Array.from(body));
}
const entries = (b: Uint8Array) => readGoneEntries(b, view(b), b.byteLength - HEADER_BYTES);

test('GONE entries: kind and key lengths, printable kinds, counts and stray bytes at their bounds', () => {
  const a = 'a'.charCodeAt(0);
  const got = entries(goneFrame([{ kind: [0x21, 0x7e], key: 0 }, { kind: new Array<number>(64).fill(a), key: MAX_GONE_KEY_BYTES }]));
  assert.deepEqual(got.map((e) => [e.kind.length, e.key.byteLength]), [[2, 0], [64, MAX_GONE_KEY_BYTES]]);
  assert.equal(got[0]!.kind, '!~');
  assert.throws(() => entries(goneFrame([{ kind: new Array<number>(65).fill(a), key: 0 }])), invalid(/bad GONE entry kind/));
  assert.throws(() => entries(goneFrame([{ kind: [], key: 0 }])), invalid(/bad GONE entry kind/));
  for (const c of [0x20, 0x7f]) assert.throws(() => entries(goneFrame([{ kind: [a, c], key: 0 }])), invalid(/GONE entry kind is not printable ASCII/));
  assert.throws(() => entries(goneFrame([{ kind: [a], key: MAX_GONE_KEY_BYTES + 1 }])), invalid(/GONE entry key past the end/));
  // The key's length pointing one past the end.
  const short = goneFrame([{ kind: [a], key: 3 }]);
  assert.throws(() => entries(short.subarray(0, short.byteLength - 1)), invalid(/GONE entry key past the end/));
  // A kind whose key length field would pass the end.
  const cut = goneFrame([{ kind: [a, a], key: 0 }]);
  assert.throws(() => entries(cut.subarray(0, cut.byteLength - 1)), invalid(/bad GONE entry kind/));
  assert.equal(entries(cut).length, 1, 'kind, then a 2-byte key length ending exactly at the end');
  assert.throws(() => entries(goneFrame([{ kind: [a], key: 0 }], 0, 2)), invalid(/truncated GONE entry/));
  // One byte left for the second entry: its kind length (0) is read, and refused as a kind.
  assert.throws(() => entries(goneFrame([{ kind: [a], key: 0 }], 1, 2)), invalid(/bad GONE entry kind/));
  assert.throws(() => entries(goneFrame([{ kind: [a], key: 0 }], 1)), invalid(/1 stray bytes after the GONE entries/));
  const n = goneFrame([{ kind: [a], key: 0 }]).byteLength - HEADER_BYTES;  // 12
  assert.throws(() => entries(goneFrame([{ kind: [a], key: 0 }], 0, n + 1)), invalid(new RegExp(`GONE announcing ${n + 1} entries in ${n} bytes`)));
  assert.throws(() => entries(goneFrame([{ kind: [a], key: 0 }], 0, n)), invalid(/truncated GONE entry/), 'as many entries as bytes: passes the count check, then runs out');
});

test('RELEASE ids and u64 fields: 1 .. 2^53-1 are ids, 0 and 2^53 are not', () => {
  const ids = (values: Array<[number, number]>) => {
    const b = frame(FrameType.Release, 0, 8 + 8 * values.length);
    values.forEach(([lo, hi], i) => { view(b).setUint32(HEADER_BYTES + 8 + 8 * i, lo, true); view(b).setUint32(HEADER_BYTES + 12 + 8 * i, hi, true); });
    return readReleaseIds(view(b), 8 + 8 * values.length);
  };
  assert.deepEqual(ids([[1, 0], [0xffff_ffff, 0x1f_ffff], [0, 1]]), [1, Number.MAX_SAFE_INTEGER, 2 ** 32]);
  assert.throws(() => ids([[1, 0], [0, 0]]), invalid(/RELEASE of lease id 0 or of an id above 2\^53/));
  assert.throws(() => ids([[0, 0x20_0000]]), invalid(/RELEASE of lease id 0/));
  const u = new DataView(new ArrayBuffer(8));
  u.setUint32(0, 5, true);
  u.setUint32(4, 0x1f_ffff, true);
  assert.equal(readU64(u, 0), 0x1f_ffff * 2 ** 32 + 5);
  u.setUint32(4, 0x20_0000, true);
  assert.equal(readU64(u, 0), -1);
});
