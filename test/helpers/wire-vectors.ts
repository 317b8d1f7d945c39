// Wire conformance vectors (test/vectors/): recorded frames and records, each with the value it
// decodes to. Node's side: one codec per kind (decode: bytes -> a plain JSON value; encode: that
// value -> bytes, with the package's own encoders), and the values the vectors were made from.
// scripts/gen-wire-vectors.mjs writes the folder from VECTORS; test/cpu/wire-vectors.test.ts and
// python/tests/test_wire_vectors.py read it back, each with its own language's decoders and encoders.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  Encoding, FrameType, HEADER_BYTES, LARGE_PAYLOAD, encodeGone, encodeRefuse, encodeRelease, parseHeader, readGoneEntries,
  readReleaseIds, readU64, writeHeader, writeU64, type FrameHeader,
} from '../../src/link/transport/frame.js';
import { encodeNcclAbort, readNcclAbort } from '../../src/link/messages/nccl-abort.js';
import { acquireEncoder } from '../../src/link/messages/message-encoder.js';
import { decodeMessage } from '../../src/link/messages/message-decoder.js';
import { decodeNcclBuffer, encodeNcclBuffer, type CommReference } from '../../src/link/messages/nccl-records.js';
import { decodeNcclTensorSet, encodeNcclTensorSet, encodePackedTable } from '../../src/tensors/nccl-wire.js';
import { decodeTensorTable, encodeTensorSet, encodeTensorTable, parseTensorSet, type AllocationKind } from '../../src/tensors/wire.js';
import { decodeDescriptor, descriptorToJson, encodeDescriptor, parseDescriptorJson } from '../../src/ipc/descriptor.js';
import { HostBuffer } from '../../src/host/host-buffer.js';
import { computeLayout, readHeader, writeHeader as writeChannelHeader } from '../../src/channel/layout.js';
import type { DType } from '../../src/ipc/dtype.js';
import { decodeLayout, encodeLayout, LayoutBuilder, tensorParallelParameter, type LocalTensor, type RankLayout } from '../../src/tensors/sharded/index.js';
import '../../src/link/index.js'; // registers the transfer handlers (host-bytes among them)

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

export const hex = (b: Uint8Array): string => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('hex');
export const unhex = (s: string): Uint8Array => new Uint8Array(Buffer.from(s.replace(/\s+/g, ''), 'hex'));

function header(bytes: Uint8Array, fdCount = 0): { h: FrameHeader; view: DataView; buf: Buffer } {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const h = parseHeader(view, bytes.byteLength, fdCount, { type: 0 as FrameType, flags: 0, payloadLength: 0, fdCount: 0 });
  return { h, view, buf: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) };
}

function frame(type: FrameType, flags: number, payload: Uint8Array, fdCount = 0): Uint8Array {
  const out = new Uint8Array(HEADER_BYTES + payload.byteLength);
  writeHeader(new DataView(out.buffer), type, flags, payload.byteLength, fdCount);
  out.set(payload, HEADER_BYTES);
  return out;
}

const commJson = (c: CommReference): Json => ({ id: hex(c.id), nranks: c.nranks, rank: c.rank, broadcast: c.broadcast, uniqueId: c.uniqueId ? hex(c.uniqueId) : null });
const commOf = (j: Json): CommReference => ({ id: unhex(j.id), nranks: j.nranks, rank: j.rank, broadcast: j.broadcast, uniqueId: j.uniqueId === null ? undefined : unhex(j.uniqueId) });

/** A decoded message value as JSON: a HostBuffer (a host-bytes record) as {"$host-bytes": hex}. */
function messageJson(v: unknown): Json {
  if (v instanceof HostBuffer) {
    const r = { '$host-bytes': hex(v.read()) };
    v.close();
    return r;
  }
  if (v instanceof Uint8Array) return { $bytes: hex(v) };
  if (Array.isArray(v)) return v.map(messageJson);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, messageJson(x)]));
  return v;
}

/** The value to send for a message vector's JSON: {"$host-bytes": hex} becomes a HostBuffer holding those bytes. */
function messageValue(j: Json, made: HostBuffer[]): unknown {
  if (j && typeof j === 'object' && !Array.isArray(j) && typeof j['$host-bytes'] === 'string') {
    const bytes = unhex(j['$host-bytes']);
    const b = HostBuffer.allocate(bytes.byteLength);
    b.write(bytes, 0);
    made.push(b);
    return b;
  }
  if (Array.isArray(j)) return j.map((x) => messageValue(x, made));
  if (j && typeof j === 'object') return Object.fromEntries(Object.entries(j).map(([k, x]) => [k, messageValue(x, made)]));
  return j;
}

const ENCODINGS = ['json', 'raw', 'json-with-records'] as const;

/** What the transfer handlers get as the link: a stand-in that counts nothing (observe's traffic hooks ask for onClose). */
const STAND_IN_LINK = { id: -1, onClose: (): void => undefined };

export interface Codec {
  encode(value: Json): Uint8Array;
  /** `fds`: how many fds arrived with the bytes (a record's entries say how many they take). */
  decode(bytes: Uint8Array, fds: number): Json;
}

const localJson = (l: LocalTensor): Json => ({
  name: l.name, dtype: l.dtype, shape: [...l.shape], strides: [...l.strides],
  pieces: l.pieces.map((p) => ({ tensor: p.tensor, start: [...p.start], length: [...p.length], at: [...p.at] })),
  padding: l.padding.map((b) => ({ start: [...b.start], length: [...b.length] })),
});
/** A sharded layout as plain JSON (what both languages' decoders give, field for field). */
const layoutJson = (l: RankLayout): Json => ({
  rank: l.rank, node: l.node, gpu: l.gpu,
  tensors: l.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: [...t.shape] })),
  sources: l.sources.map(localJson), destinations: l.destinations.map(localJson),
});

export const CODECS: Record<string, Codec> = {
  // A rank's layout for a sharded-weights group (docs/PROTOCOL.md 9: the 'CISL' record).
  'sharded-layout': {
    encode: (v) => encodeLayout(v as RankLayout),
    decode: (b) => layoutJson(decodeLayout(b)),
  },
  'frame-hello': {
    encode: (v) => { const p = new Uint8Array(8); new DataView(p.buffer).setUint32(0, v.features, true); return frame(FrameType.Hello, 0, p); },
    decode: (b) => { const { view } = header(b); return { features: view.getUint32(HEADER_BYTES, true) }; },
  },
  'frame-goodbye': {
    encode: () => frame(FrameType.Goodbye, 0, new Uint8Array(0)),
    decode: (b) => { header(b); return {}; },
  },
  'frame-refuse': {
    encode: (v) => encodeRefuse(v.reason, v.text),
    decode: (b) => { const { h, view, buf } = header(b); return { reason: view.getUint16(HEADER_BYTES, true), text: buf.toString('utf8', HEADER_BYTES + 2, HEADER_BYTES + h.payloadLength) }; },
  },
  'frame-release': {
    encode: (v) => encodeRelease(v.ids),
    decode: (b) => { const { h, view } = header(b); return { ids: readReleaseIds(view, h.payloadLength) }; },
  },
  'frame-gone': {
    encode: (v) => { const frames = encodeGone(v.entries.map((e: Json) => ({ kind: e.kind, key: unhex(e.key) }))); if (frames.length !== 1) throw new Error('one frame'); return frames[0]!; },
    decode: (b) => { const { h, view } = header(b); return { entries: readGoneEntries(b, view, h.payloadLength).map((e) => ({ kind: e.kind, key: hex(e.key) })) }; },
  },
  'frame-nccl-abort': {
    encode: (v) => encodeNcclAbort(unhex(v.communicator), v.reason, v.text),
    decode: (b) => { const { h, view, buf } = header(b); const a = readNcclAbort(buf, view, h.payloadLength); return { communicator: hex(a.id), reason: a.reason, text: a.text }; },
  },
  // A MESSAGE frame whose payload is in the frame: JSON, raw bytes, or JSON with transfer records
  // (a host-bytes record here: a HostBuffer on a TCP link, its bytes copied into the message).
  'frame-message': {
    encode: (v) => {
      const made: HostBuffer[] = [];
      const enc = acquireEncoder();
      try {
        const value = v.encoding === 'raw' ? unhex(v.value.$bytes) : messageValue(v.value, made);
        const out = enc.encode(value, STAND_IN_LINK, undefined, v.transport);
        const payload = out.body ? new Uint8Array(out.body) : new Uint8Array(enc.scratch.subarray(HEADER_BYTES, out.headLength));
        if (out.fds.length) throw new Error('a vector message carries no fds');
        return frame(FrameType.Message, out.encoding, payload);
      } finally {
        enc.busy = false;
        for (const b of made) b.close();
      }
    },
    decode: (b) => {
      const { h, buf } = header(b);
      const encoding = h.flags & 0xff;
      const transport = encoding === Encoding.JsonWithRecords ? 'tcp' : 'unix';
      const d = decodeMessage(encoding as Encoding, buf, HEADER_BYTES, HEADER_BYTES + h.payloadLength, [], STAND_IN_LINK, undefined, undefined, transport);
      if (!d.ok) throw d.error;
      const value = encoding === Encoding.Raw ? { $bytes: hex(d.value as Uint8Array) } : messageJson(d.value);
      return encoding === Encoding.JsonWithRecords ? { encoding: ENCODINGS[encoding], transport, value } : { encoding: ENCODINGS[encoding], transport: 'unix', value };
    },
  },
  // A large message's frame: its payload travels in a sealed memfd (the frame's one fd); the frame
  // carries the payload's length in its 8 inline bytes.
  'frame-large-message': {
    encode: (v) => { const p = new Uint8Array(8); writeU64(new DataView(p.buffer), 0, v.length); return frame(FrameType.Message, ENCODINGS.indexOf(v.encoding) | LARGE_PAYLOAD, p, 1); },
    decode: (b) => { const { h, view } = header(b, 1); return { encoding: ENCODINGS[h.flags & 0xff], length: readU64(view, HEADER_BYTES) }; },
  },
  descriptor: {
    encode: (v) => encodeDescriptor(parseDescriptorJson(v)),
    decode: (b) => descriptorToJson(decodeDescriptor(b)),
  },
  'nccl-buffer': {
    encode: (v) => encodeNcclBuffer({ comm: commOf(v.comm), sequence: v.sequence, byteLength: v.byteLength, deviceUuid: unhex(v.deviceUuid), array: v.array ?? undefined }),
    decode: (b) => { const r = decodeNcclBuffer(b); return { comm: commJson(r.comm), sequence: r.sequence, byteLength: r.byteLength, deviceUuid: hex(r.deviceUuid), array: r.array ? { dtype: r.array.dtype, shape: [...r.array.shape] } : null }; },
  },
  'nccl-tensor-set': {
    encode: (v) => encodeNcclTensorSet({ comm: commOf(v.comm), sequence: v.sequence }, encodePackedTable(v.tensors), v.tensors.length, v.packedLength, v.chunkBytes),
    decode: (b) => {
      const r = decodeNcclTensorSet(b);
      const L = r.layout;
      return {
        comm: commJson(r.comm), sequence: r.sequence, packedLength: r.packedLength, chunkBytes: r.chunkBytes,
        tensors: L.names.map((name, i) => ({ name, dtype: L.dtypes[i], shape: [...L.shapes[i]!], offset: L.offsets[i] })),
      };
    },
  },
  'tensor-set': {
    encode: (v) => encodeTensorSet(
      v.allocations.map((a: Json) => ({ kind: a.kind as AllocationKind, fdCount: a.fdCount, data: unhex(a.data) })),
      encodeTensorTable(v.tensors.map((t: Json) => ({ ...t, dtype: t.dtype as DType })), v.allocations.length), v.tensors.length),
    decode: (b, fds) => {
      const s = parseTensorSet(b, fds);
      const L = decodeTensorTable(s.table, s.tensorCount, s.allocations.map((a) => a.size));
      return {
        allocations: s.allocations.map((a) => ({ kind: a.kind, fdCount: a.fdCount, data: hex(a.data) })),
        tensors: L.names.map((name, i) => ({ name, dtype: L.dtypes[i], shape: [...L.shapes[i]!], strides: [...L.strides[i]!], offset: L.offsets[i], allocation: L.allocations[i] })),
      };
    },
  },
  // A fresh channel control block (docs/channel-protocol.md section 3): the header a hub writes,
  // zeros after it. Python only reads one (a Python end joins a channel; Node's hub makes it).
  'channel-control-block': {
    encode: (v) => {
      const l = computeLayout({ slotCount: v.slotCount, slotBytes: v.slotBytes, metaBytes: v.metaBytes, maxParticipants: v.maxParticipants, device: v.device, broadcast: v.broadcast });
      const block = new Uint8Array(l.totalBytes);
      writeChannelHeader(new DataView(block.buffer), l, v.expectProducers, v.expectConsumers);
      return block;
    },
    decode: (b) => {
      const l = readHeader(new DataView(b.buffer, b.byteOffset, b.byteLength), b.byteLength);
      return {
        slotCount: l.slotCount, slotBytes: l.slotBytes, metaBytes: l.metaBytes, maxParticipants: l.maxParticipants, device: l.device, broadcast: l.broadcast,
        expectProducers: l.expectProducers, expectConsumers: l.expectConsumers, participantsOffset: l.participantsOffset, ringOffset: l.ringOffset,
        slotRecordsOffset: l.slotRecordsOffset, slotRecordBytes: l.slotRecordBytes, fencesOffset: l.fencesOffset, totalBytes: l.totalBytes,
      };
    },
  },
};

export interface Vector {
  name: string;
  kind: keyof typeof CODECS;
  /** What the vector shows, for a reader. */
  note: string;
  /** fds that travel beside the bytes (a tensor set's host allocation: its memfd); 0 when absent. */
  fds?: number;
  value: Json;
}

const COMM_ID = '00112233445566778899aabbccddeeff';
const UUID = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';
/** A host-buffer allocation entry: file length, offset, length (u64 each). */
const hostEntry = (fileLength: number, offset: number, length: number): string => {
  const b = new Uint8Array(24);
  const v = new DataView(b.buffer);
  writeU64(v, 0, fileLength);
  writeU64(v, 8, offset);
  writeU64(v, 16, length);
  return hex(b);
};

/** The vectors scripts/gen-wire-vectors.mjs records (new record kinds add theirs here). */
export const VECTORS: Vector[] = [
  { name: 'hello', kind: 'frame-hello', note: 'HELLO of a link offering large messages and GONE (features 3)', value: { features: 3 } },
  { name: 'hello-nccl', kind: 'frame-hello', note: 'HELLO of a TCP link offering NCCL too (features 11)', value: { features: 11 } },
  { name: 'goodbye', kind: 'frame-goodbye', note: 'GOODBYE: the sender ends the link cleanly', value: {} },
  { name: 'refuse-uid', kind: 'frame-refuse', note: 'REFUSE, reason 1 (uid not allowed), with its text', value: { reason: 1, text: 'uid 1001 is not allowed on this link' } },
  { name: 'release-one', kind: 'frame-release', note: 'RELEASE of one lease', value: { ids: [7] } },
  { name: 'release-many', kind: 'frame-release', note: 'RELEASE of three leases, one above 2^32', value: { ids: [1, 2, 4294967298] } },
  { name: 'gone', kind: 'frame-gone', note: 'GONE: a pool buffer and a legacy buffer freed by their owner', value: { entries: [{ kind: 'pool-buffer', key: '0102030405060708' }, { kind: 'legacy-buffer', key: 'ff'.repeat(16) }] } },
  { name: 'nccl-abort', kind: 'frame-nccl-abort', note: 'NCCL_ABORT of a communicator, reason 2, with its text', value: { communicator: COMM_ID, reason: 2, text: 'rank 1 timed out' } },
  { name: 'message-json', kind: 'frame-message', note: 'MESSAGE, JSON: nested objects, an array, unicode', value: { encoding: 'json', transport: 'unix', value: { step: 42, loss: 0.125, tags: ['a', 'ü', '✓'], nested: { ok: true, none: null } } } },
  { name: 'message-number', kind: 'frame-message', note: 'MESSAGE, JSON: a lone number', value: { encoding: 'json', transport: 'unix', value: 17 } },
  { name: 'message-raw', kind: 'frame-message', note: 'MESSAGE, raw bytes', value: { encoding: 'raw', transport: 'unix', value: { $bytes: '000102fffe' } } },
  { name: 'message-host-bytes', kind: 'frame-message', note: "MESSAGE, JSON with records: a HostBuffer on a TCP link, its bytes copied in a 'host-bytes' record", value: { encoding: 'json-with-records', transport: 'tcp', value: { weights: { '$host-bytes': '0a0b0c0d0e0f' }, step: 3 } } },
  { name: 'large-message', kind: 'frame-large-message', note: "a large message's frame: the payload (3 MiB of JSON) in the sealed memfd it carries", value: { encoding: 'json', length: 3 * 1024 * 1024 } },
  {
    name: 'descriptor-legacy', kind: 'descriptor', note: "a 'cuda-legacy-handle' descriptor with array metadata",
    value: descriptorToJson(parseDescriptorJson({ kind: 'cuda-legacy-handle', version: 1, deviceUuid: 'GPU-a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90', handle: '11'.repeat(64), offset: 4096, byteLength: 1048576, pid: 4242, array: { dtype: 'float32', shape: [256, 1024] } })),
  },
  {
    name: 'descriptor-event', kind: 'descriptor', note: "a 'cuda-ipc-event' descriptor",
    value: descriptorToJson(parseDescriptorJson({ kind: 'cuda-ipc-event', version: 1, deviceUuid: 'GPU-a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90', handle: '22'.repeat(64), pid: 4242 })),
  },
  {
    name: 'nccl-buffer-first', kind: 'nccl-buffer', note: "an 'nccl-buffer' record naming its communicator for the first time (unique id included), of a float16 array",
    value: { comm: { id: COMM_ID, nranks: 2, rank: 1, broadcast: false, uniqueId: '5a'.repeat(128) }, sequence: 0, byteLength: 4096, deviceUuid: UUID, array: { dtype: 'float16', shape: [32, 64] } },
  },
  {
    name: 'nccl-buffer-broadcast', kind: 'nccl-buffer', note: "an 'nccl-buffer' record on a known broadcast communicator, plain bytes",
    value: { comm: { id: COMM_ID, nranks: 4, rank: 3, broadcast: true, uniqueId: null }, sequence: 9, byteLength: 123457, deviceUuid: UUID, array: null },
  },
  {
    name: 'nccl-tensor-set', kind: 'nccl-tensor-set', note: "an 'nccl-tensor-set' record: three tensors packed in one stream of 1 MiB chunks",
    value: {
      comm: { id: COMM_ID, nranks: 2, rank: 1, broadcast: false, uniqueId: null }, sequence: 5, packedLength: 2 * 1024 * 1024 + 1024, chunkBytes: 1024 * 1024,
      tensors: [
        { name: 'layers.0.weight', dtype: 'bfloat16', shape: [1024, 1024], offset: 0 },
        { name: 'layers.0.bias', dtype: 'float32', shape: [128], offset: 2 * 1024 * 1024 },
        { name: 'layers.1.weight', dtype: 'int8', shape: [512], offset: 2 * 1024 * 1024 + 512 },
      ],
    },
  },
  {
    name: 'tensor-set-host', kind: 'tensor-set', note: "a 'tensor-set' record over one host allocation: a C-contiguous tensor and a transposed view", fds: 1,
    value: {
      allocations: [{ kind: 3, fdCount: 1, data: hostEntry(8192, 0, 8192) }],
      tensors: [
        { name: 'a.weight', dtype: 'float32', shape: [16, 32], strides: [128, 4], offset: 0, allocation: 0 },
        { name: 'a.weight_t', dtype: 'float32', shape: [32, 16], strides: [4, 128], offset: 0, allocation: 0 },
        { name: 'b', dtype: 'int64', shape: [], strides: [], offset: 2048, allocation: 0 },
      ],
    },
  },
  {
    name: 'channel-host', kind: 'channel-control-block', note: 'a fresh control block of a host channel: 4 work-sharing slots of 1 KiB with 16 bytes of meta, 3 participants',
    value: { slotCount: 4, slotBytes: 1024, metaBytes: 16, maxParticipants: 3, device: false, broadcast: false, expectProducers: 1, expectConsumers: 2 },
  },
  {
    name: 'channel-device-broadcast', kind: 'channel-control-block', note: 'a fresh control block of a device broadcast channel: 2 slots of 1 MiB, fences after the slot records',
    value: { slotCount: 2, slotBytes: 1024 * 1024, metaBytes: 0, maxParticipants: 2, device: true, broadcast: true, expectProducers: 1, expectConsumers: 1 },
  },
  {
    name: 'sharded-layout-trainer', kind: 'sharded-layout', note: "a 'CISL' layout record: FSDP rank 1 of 2 (Shard(0)) holding q, k and an uneven embedding's last rows, on node 'train'",
    value: layoutJson(new LayoutBuilder({ rank: 1, node: 'train', gpu: 1 })
      .hold('q', { dtype: 'bfloat16', shape: [8, 16], mesh: [2], placements: [{ shard: 0 }], coordinate: [1] })
      .hold('k', { dtype: 'bfloat16', shape: [4, 16], mesh: [2], placements: [{ shard: 0 }], coordinate: [1] })
      .hold('embed', { dtype: 'bfloat16', shape: [5, 16], mesh: [2], placements: [{ shard: 0 }], coordinate: [1] })
      .build()),
  },
  {
    name: 'sharded-layout-engine', kind: 'sharded-layout', note: "a 'CISL' layout record: tensor-parallel rank 0 of 2 needing a fused qk (two pieces) and a vocabulary padded to a multiple of 4 (a padding box)",
    value: layoutJson(new LayoutBuilder({ rank: 2, node: 'infer', gpu: 0 })
      .needParameter('qk_proj', tensorParallelParameter({ dtype: 'bfloat16', dim: 0, size: 2, rank: 0, parts: [{ tensor: 'q', shape: [8, 16] }, { tensor: 'k', shape: [4, 16] }] }))
      .needParameter('embed_tokens', tensorParallelParameter({ dtype: 'bfloat16', dim: 0, size: 2, rank: 1, padMultiple: 4, parts: [{ tensor: 'embed', shape: [5, 16] }] }))
      .build()),
  },
];

export interface RecordedVector extends Vector {
  bytes: Uint8Array;
}

/** The vectors of `dir` (test/vectors): NAME.json (kind, note, value) beside NAME.hex (the bytes). */
export function readVectors(dir: string): RecordedVector[] {
  return readdirSync(dir).filter((f) => f.endsWith('.json')).sort().map((f) => {
    const meta = JSON.parse(readFileSync(join(dir, f), 'utf8')) as Vector;
    return { ...meta, name: f.slice(0, -5), bytes: unhex(readFileSync(join(dir, `${f.slice(0, -5)}.hex`), 'utf8')) };
  });
}

/** Hex in lines of 32 bytes, for a readable diff. */
export function hexLines(b: Uint8Array): string {
  const h = hex(b);
  const lines: string[] = [];
  for (let i = 0; i < h.length; i += 64) lines.push(h.slice(i, i + 64));
  return `${lines.join('\n')}\n`;
}
