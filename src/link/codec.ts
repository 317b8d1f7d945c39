// Message payloads: what link.send(value) puts in a MESSAGE frame and how the receiver rebuilds it.
//
// Encodings (the frame's flags):
//   Raw:  `value` was a Uint8Array; the payload is its bytes (sent straight from the caller's
//         memory) and it arrives as a new Uint8Array.
//   Json: UTF-8 JSON of `value`; empty payload = undefined. The common, fast case.
//   JsonWithRecords: JSON in which every bigint, typed array and transferable object was replaced
//         by null, followed by one record per replaced value saying where it goes:
//           u32 jsonLength | json | u16 recordCount (>= 1) | record*
//           record = u8 kindLength (>= 1) | kind (ASCII) | u8 pathLength | segment* | u8 fdCount
//                    | u64 leaseId | u32 dataLength | data
//           segment = u8 0, u32 array index | u8 1, u16 keyLength, key (UTF-8)
//         The record's fds are the next fdCount of the frame's fds, in record order; the fd
//         counts add up to the frame's. leaseId (since frame version 2) is 0 when the value is
//         not leased, else 1..2^53-1, unique among the leases the receiver holds from this link;
//         the receiver returns it in a RELEASE frame once done with the value (lease.ts).
//         Every placement must point at a null in the JSON; nothing may follow the last record.
// Built-in record kinds: '@bigint' (ASCII decimal, no fds, no lease) and '@typed-array' (u8 type
// tag, then bytes; no fds, no lease). Anything out of spec is ERR_FRAME_INVALID and closes the link.
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import { Encoding, HEADER_BYTES, MAX_FDS, MAX_FRAME_BYTES, readLeaseId, writeLeaseId } from './frame.js';
import { nextLeaseId, releaseHold, type IncomingLeases, type LeaseHold, type ReceivedLease } from './lease.js';
import { handlerForKind, handlerForValue, type TransferHandler } from './transfer.js';
import type { Link } from './link.js';
import { probe, Probe } from './probe.js';

const MAX_DEPTH = 255;
/** u8 fdCount, u64 leaseId, u32 dataLength: between a record's path and its data. */
const RECORD_TAIL_BYTES = 13;
type Segment = string | number;

/** Typed arrays the built-in '@typed-array' record carries, by wire tag. */
const TYPED_ARRAYS = [
  undefined,
  Uint8Array,
  Int8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
] as const;
const DATA_VIEW_TAG = TYPED_ARRAYS.length;

function typedArrayTag(v: ArrayBufferView): number {
  if (v instanceof DataView) return DATA_VIEW_TAG;
  for (let i = 1; i < TYPED_ARRAYS.length; i++) if (v instanceof TYPED_ARRAYS[i]!) return i;
  return 0;
}

/** A value found by the scan that travels as a record. */
interface Found {
  path: Segment[];
  bigint?: bigint;
  view?: ArrayBufferView;
  handler?: TransferHandler;
  value?: object;
}

function notTransferable(what: string, path: readonly Segment[]): IpcError {
  const where = path.length ? ` at ${path.map((s) => (typeof s === 'number' ? `[${s}]` : `.${s}`)).join('')}` : '';
  return new IpcError(
    'ERR_NOT_TRANSFERABLE',
    `link.send: cannot send ${what}${where}. Messages hold JSON data (plain objects, arrays, strings, numbers, ` +
      'booleans, null), bigints, typed arrays and objects with a registered transfer handler ' +
      '(HostBuffer, or buffers/pools/events once their module is imported); convert other values first',
  );
}

/**
 * Walks `v` looking for values JSON cannot carry. Returns `v` itself when its subtree has none,
 * otherwise a copy (made only along the paths that changed) with those values replaced by null.
 */
function scan(v: unknown, path: Segment[], found: Found[]): unknown {
  switch (typeof v) {
    case 'string':
    case 'number':
    case 'boolean':
    case 'undefined':
      return v;
    case 'bigint':
      found.push({ path: path.slice(), bigint: v });
      return null;
    case 'object':
      break;
    default:
      throw notTransferable(`a ${typeof v}`, path);
  }
  if (v === null) return v;
  if (path.length >= MAX_DEPTH) {
    throw new IpcError('ERR_INVALID_ARG', `link.send: the message is nested deeper than ${MAX_DEPTH} levels (or contains a cycle)`);
  }
  if (Array.isArray(v)) {
    let copy: unknown[] | undefined;
    for (let i = 0; i < v.length; i++) {
      const e: unknown = v[i];
      if (e === null || (typeof e !== 'object' && typeof e !== 'bigint' && typeof e !== 'function' && typeof e !== 'symbol')) continue;
      path.push(i);
      const s = scan(e, path, found);
      path.pop();
      if (s !== e) (copy ??= v.slice())[i] = s;
    }
    return copy ?? v;
  }
  const proto: unknown = Object.getPrototypeOf(v);
  if (proto === Object.prototype || proto === null) {
    let copy: Record<string, unknown> | undefined;
    const obj = v as Record<string, unknown>;
    for (const key of Object.keys(obj)) {
      const e = obj[key];
      if (e === null || (typeof e !== 'object' && typeof e !== 'bigint' && typeof e !== 'function' && typeof e !== 'symbol')) continue;
      path.push(key);
      const s = scan(e, path, found);
      path.pop();
      if (s !== e) (copy ??= { ...obj })[key] = s;
    }
    return copy ?? v;
  }
  if (ArrayBuffer.isView(v)) {
    if (typedArrayTag(v) === 0) throw notTransferable(`a ${v.constructor.name}`, path);
    found.push({ path: path.slice(), view: v });
    return null;
  }
  const handler = handlerForValue(v);
  if (!handler) throw notTransferable(`an object of class ${(v as object).constructor?.name ?? 'unknown'} (no transfer handler is registered for it)`, path);
  found.push({ path: path.slice(), handler, value: v });
  return null;
}

/**
 * The transfer handler of `value` when the value itself travels as a record: an object that is
 * not a plain object, array or typed array (what scan() would hand to handlerForValue).
 */
function soleTransferable(value: unknown): TransferHandler | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || ArrayBuffer.isView(value)) return undefined;
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) return undefined;
  return handlerForValue(value);
}

function tooLarge(bytes: number | string): IpcError {
  return new IpcError(
    'ERR_MESSAGE_TOO_LARGE',
    `link.send: the encoded message needs ${bytes} bytes, more than a link frame holds (${MAX_FRAME_BYTES - HEADER_BYTES}); ` +
      'send bulk data in a HostBuffer (or a device buffer) and put the buffer in the message instead',
  );
}

/** The result of encoding one message into the encoder's scratch buffer. */
export interface EncodedMessage {
  encoding: Encoding;
  /** Frame bytes are scratch[0, headLength), followed by `body` when it is set (Raw). */
  headLength: number;
  body: Uint8Array | null;
  fds: number[];
  /** fds the link must close after sending (handlers' closeFdsAfterSend). */
  ownedFds: number[];
  /** Handlers' onCommit callbacks, to run once the frame is sent or queued. */
  commits: Array<() => void>;
  /**
   * Handlers' holds with the lease ids written into their records: the link records them once
   * the frame is sent or queued, and releases them if the send fails.
   */
  holds: Array<{ id: number; hold: LeaseHold }>;
}

/** Encodes messages into a scratch buffer that holds a whole frame (header left to the caller). */
export class MessageEncoder {
  readonly scratch = Buffer.allocUnsafeSlow(MAX_FRAME_BYTES);
  readonly view = new DataView(this.scratch.buffer, this.scratch.byteOffset, MAX_FRAME_BYTES);
  /** Set while encoding, so that a re-entrant send (from a handler) takes another encoder. */
  busy = false;
  readonly #out: EncodedMessage = { encoding: Encoding.Json, headLength: 0, body: null, fds: [], ownedFds: [], commits: [], holds: [] };

  /**
   * Encodes `value`. The result (and scratch) are valid until the next encode. If this throws,
   * every fd a handler handed over with closeFdsAfterSend has already been closed and every hold
   * a handler returned has been released.
   */
  encode(value: unknown, link: Link): EncodedMessage {
    const out = this.#out;
    out.body = null;
    // (Setting an array's length is a runtime call even when it is 0 already.)
    if (out.fds.length) out.fds.length = 0;
    if (out.ownedFds.length) out.ownedFds.length = 0;
    if (out.commits.length) out.commits.length = 0;
    if (out.holds.length) out.holds.length = 0;
    if (value instanceof Uint8Array) {
      if (value.byteLength > MAX_FRAME_BYTES - HEADER_BYTES) throw tooLarge(value.byteLength);
      out.encoding = Encoding.Raw;
      out.headLength = HEADER_BYTES;
      out.body = value;
      return out;
    }
    const found: Found[] = [];
    // The commonest message with records is one transferable object (link.send(buffer)): its
    // JSON is null and its one record has an empty path, with no walk to find that out.
    const handler = soleTransferable(value);
    const substitute = handler ? null : scan(value, [], found);
    if (handler) found.push({ path: [], handler, value: value as object });
    if (found.length === 0) {
      out.encoding = Encoding.Json;
      out.headLength = value === undefined ? HEADER_BYTES : this.#writeString(JSON.stringify(value), HEADER_BYTES);
      return out;
    }
    try {
      out.encoding = Encoding.JsonWithRecords;
      const jsonEnd = this.#writeString(substitute === null ? 'null' : JSON.stringify(substitute) ?? 'null', HEADER_BYTES + 4);
      this.view.setUint32(HEADER_BYTES, jsonEnd - HEADER_BYTES - 4, true);
      this.#room(jsonEnd, 2);
      this.view.setUint16(jsonEnd, found.length, true);
      let at = jsonEnd + 2;
      for (const f of found) at = this.#writeRecord(f, at, link, out);
      out.headLength = at;
      return out;
    } catch (e) {
      for (const fd of out.ownedFds) closeQuietly(fd);
      out.ownedFds.length = 0;
      for (const { hold } of out.holds) releaseHold(hold);
      out.holds.length = 0;
      throw e;
    }
  }

  /** Checks that `n` more bytes fit at `at`; returns `at`. */
  #room(at: number, n: number): number {
    if (at + n > MAX_FRAME_BYTES) throw tooLarge('more than ' + (MAX_FRAME_BYTES - HEADER_BYTES));
    return at;
  }

  #writeString(s: string, at: number): number {
    // Short ASCII (most keys, kinds and small JSON) is copied here: cheaper than the call into
    // Buffer.write. Anything else takes the general path.
    if (s.length <= 64 && at + s.length <= MAX_FRAME_BYTES) {
      const b = this.scratch;
      let i = 0;
      for (; i < s.length; i++) {
        const c = s.charCodeAt(i);
        if (c > 0x7f) break;
        b[at + i] = c;
      }
      if (i === s.length) return at + i;
    }
    // Worst case 3 bytes per UTF-16 unit; only count exactly when that might not fit.
    if (s.length * 3 > MAX_FRAME_BYTES - at) {
      const n = Buffer.byteLength(s);
      if (at + n > MAX_FRAME_BYTES) throw tooLarge(n + at - HEADER_BYTES);
    }
    return at + this.scratch.write(s, at, 'utf8');
  }

  #writeAscii(s: string, at: number): number {
    this.#room(at, 1 + s.length);
    this.scratch[at] = s.length;
    return this.#writeString(s, at + 1);  // kinds are ASCII (registerTransferHandler checks)
  }

  #writeRecord(f: Found, at: number, link: Link, out: EncodedMessage): number {
    const v = this.view;
    let data: Uint8Array | undefined;
    let fds: readonly number[] | undefined;
    let kind: string;
    let tag = 0;
    let leaseId = 0;
    if (f.bigint !== undefined) {
      kind = '@bigint';
      data = Buffer.from(f.bigint.toString(), 'latin1');
    } else if (f.view) {
      kind = '@typed-array';
      tag = typedArrayTag(f.view);
      data = new Uint8Array(f.view.buffer, f.view.byteOffset, f.view.byteLength);
    } else {
      const h = f.handler!;
      kind = h.kind;
      probe?.(Probe.ExportStart);
      const enc = h.encode(f.value!, link);
      probe?.(Probe.ExportEnd);
      fds = enc.fds;
      // Taken over before anything else can fail, so that a failure releases them.
      if (fds && enc.closeFdsAfterSend) out.ownedFds.push(...fds);
      if (enc.hold !== undefined) {
        const hold = enc.hold;
        if (typeof hold?.release !== 'function') {
          throw new IpcError('ERR_INVALID_ARG', `transfer handler '${kind}' returned a hold without a release() function`);
        }
        leaseId = nextLeaseId();
        out.holds.push({ id: leaseId, hold });
        const bytes = hold.bytes;
        if (bytes !== undefined && !(Number.isSafeInteger(bytes) && bytes >= 0)) {
          throw new IpcError('ERR_INVALID_ARG', `transfer handler '${kind}' returned a hold whose bytes (${String(bytes)}) is not a non-negative integer`);
        }
      }
      if (enc.onCommit) out.commits.push(enc.onCommit);
      data = enc.data;
      if (!(data instanceof Uint8Array)) throw new IpcError('ERR_INVALID_ARG', `transfer handler '${kind}' returned data that is not a Uint8Array`);
    }
    at = this.#writeAscii(kind, at);
    this.#room(at, 1);
    v.setUint8(at++, f.path.length);
    for (const seg of f.path) {
      if (typeof seg === 'number') {
        this.#room(at, 5);
        v.setUint8(at, 0);
        v.setUint32(at + 1, seg, true);
        at += 5;
      } else {
        this.#room(at, 3);
        v.setUint8(at, 1);
        const end = this.#writeString(seg, at + 3);
        if (end - at - 3 > 0xffff) throw new IpcError('ERR_INVALID_ARG', 'link.send: an object key is longer than 65535 bytes');
        v.setUint16(at + 1, end - at - 3, true);
        at = end;
      }
    }
    const nfds = fds?.length ?? 0;
    if (out.fds.length + nfds > MAX_FDS) {
      throw new IpcError('ERR_MESSAGE_TOO_LARGE', `link.send: the message would carry more than ${MAX_FDS} fds; split it into several messages`);
    }
    if (fds) out.fds.push(...fds);
    const dataLength = data.byteLength + (tag ? 1 : 0);
    this.#room(at, RECORD_TAIL_BYTES + dataLength);
    v.setUint8(at, nfds);
    writeLeaseId(v, at + 1, leaseId);
    v.setUint32(at + 9, dataLength, true);
    at += RECORD_TAIL_BYTES;
    if (tag) v.setUint8(at++, tag);
    this.scratch.set(data, at);
    return at + data.byteLength;
  }
}

function closeQuietly(fd: number): void {
  try {
    addon.close(fd);
  } catch {
    // Already closed by someone else: nothing left to release.
  }
}

const sharedEncoder = new MessageEncoder();
/** The process's encoder, or a fresh one when it is in use (a handler sending from encode()). */
export function acquireEncoder(): MessageEncoder {
  return sharedEncoder.busy ? new MessageEncoder() : sharedEncoder;
}

// ---------------------------------------------------------------------------------------------
// Decoding

export type Decoded =
  | { ok: true; value: unknown; owned: object[] | undefined }
  /** fatal: the payload is malformed (the link must close); otherwise only this message failed. */
  | { ok: false; error: IpcError; fatal: boolean };

function malformed(why: string): Decoded {
  return { ok: false, fatal: true, error: new IpcError('ERR_FRAME_INVALID', `received a malformed message payload: ${why}`) };
}

interface ParsedRecord {
  kind: string;
  path: Segment[];
  fdCount: number;
  /** 0 when the value is not leased. */
  leaseId: number;
  dataStart: number;
  dataEnd: number;
}

/** Disposes decoded values that will never reach the user. */
export function disposeValues(values: readonly object[] | undefined): void {
  if (!values) return;
  for (const v of values) {
    try {
      const d = v as { close?: () => void; [Symbol.dispose]?: () => void };
      if (typeof d[Symbol.dispose] === 'function') d[Symbol.dispose]!();
      else if (typeof d.close === 'function') d.close();
    } catch {
      // Best effort: the value is being discarded anyway.
    }
  }
}

/**
 * Decodes the payload buf[start, end) of a MESSAGE frame that arrived with `fds` (owned by this
 * function from the call on: every fd ends up in a decoded value or closed). `leases` is the
 * link's table of leases received from its peer; without one (tests), a leased record is refused.
 * Never throws: a failure is returned, fatal when the payload is out of spec.
 */
export function decodeMessage(
  encoding: Encoding,
  buf: Buffer,
  start: number,
  end: number,
  fds: number[] | undefined,
  link: Link,
  leases: IncomingLeases | undefined,
  view: DataView = new DataView(buf.buffer, buf.byteOffset, buf.byteLength),
): Decoded {
  if (encoding === Encoding.Raw) return { ok: true, value: copyBytes(buf, start, end), owned: undefined };
  if (encoding === Encoding.Json) {
    if (start === end) return { ok: true, value: undefined, owned: undefined };
    try {
      return { ok: true, value: parseJson(buf, start, end), owned: undefined };
    } catch {
      return malformed('the JSON does not parse');
    }
  }
  const all = fds ?? [];
  const r = decodeWithRecords(buf, view, start, end, all, link, leases);
  // On failure every fd not taken by a handler (marked -1) is closed here.
  if (!r.ok) for (const fd of all) if (fd >= 0) closeQuietly(fd);
  return r;
}

/** JSON.parse of buf[start, end): short ASCII text is read here, cheaper than a native slice. */
function parseJson(buf: Buffer, start: number, end: number): unknown {
  const n = end - start;
  if (n === 4 && buf[start] === 0x6e && buf[start + 1] === 0x75 && buf[start + 2] === 0x6c && buf[start + 3] === 0x6c) return null;
  if (n <= 32) {
    let text = '';
    for (let i = start; i < end; i++) {
      const c = buf[i]!;
      if (c > 0x7f) return JSON.parse(buf.toString('utf8', start, end));
      text += String.fromCharCode(c);
    }
    return JSON.parse(text);
  }
  return JSON.parse(buf.toString('utf8', start, end));
}

// Record kinds seen recently, with their bytes: a message names one of a handful of kinds, and
// comparing a few bytes is cheaper than making a string each time.
const kindCache: Array<{ kind: string; bytes: Uint8Array }> = [];

/** The ASCII kind at buf[at, at + length). */
function kindAt(buf: Buffer, at: number, length: number): string {
  for (const k of kindCache) {
    const b = k.bytes;
    if (b.length !== length) continue;
    let i = 0;
    while (i < length && buf[at + i] === b[i]) i++;
    if (i === length) return k.kind;
  }
  const kind = buf.toString('latin1', at, at + length);
  if (kindCache.length >= 16) kindCache.shift();
  kindCache.push({ kind, bytes: Uint8Array.from(buf.subarray(at, at + length)) });
  return kind;
}

function parseRecords(buf: Buffer, v: DataView, start: number, end: number, records: ParsedRecord[]): { root: unknown; fdTotal: number } | Decoded {
  let at = start;
  const need = (n: number): boolean => at + n <= end;
  if (!need(4)) return malformed('truncated JSON length');
  const jsonLength = v.getUint32(at, true);
  at += 4;
  if (!need(jsonLength)) return malformed('JSON length past the end');
  let root: unknown;
  try {
    root = parseJson(buf, at, at + jsonLength);
  } catch {
    return malformed('the JSON does not parse');
  }
  at += jsonLength;
  if (!need(2)) return malformed('truncated record count');
  const count = v.getUint16(at, true);
  at += 2;
  if (count === 0) return malformed('no records in a message that announces records');
  let fdTotal = 0;
  for (let i = 0; i < count; i++) {
    if (!need(1)) return malformed('truncated record');
    const kindLength = v.getUint8(at++);
    if (kindLength === 0 || !need(kindLength + 1)) return malformed('bad record kind');
    const kind = kindAt(buf, at, kindLength);
    at += kindLength;
    const pathLength = v.getUint8(at++);
    const path: Segment[] = [];
    for (let s = 0; s < pathLength; s++) {
      if (!need(1)) return malformed('truncated path');
      const tag = v.getUint8(at++);
      if (tag === 0) {
        if (!need(4)) return malformed('truncated path index');
        path.push(v.getUint32(at, true));
        at += 4;
      } else if (tag === 1) {
        if (!need(2)) return malformed('truncated path key');
        const n = v.getUint16(at, true);
        at += 2;
        if (!need(n)) return malformed('path key past the end');
        path.push(buf.toString('utf8', at, at + n));
        at += n;
      } else {
        return malformed(`unknown path segment tag ${tag}`);
      }
    }
    if (!need(RECORD_TAIL_BYTES)) return malformed('truncated record data');
    const fdCount = v.getUint8(at);
    const leaseId = readLeaseId(v, at + 1);
    if (leaseId < 0) return malformed('a lease id above 2^53');
    const dataLength = v.getUint32(at + 9, true);
    at += RECORD_TAIL_BYTES;
    if (!need(dataLength)) return malformed('record data past the end');
    records.push({ kind, path, fdCount, leaseId, dataStart: at, dataEnd: at + dataLength });
    at += dataLength;
    fdTotal += fdCount;
  }
  if (at !== end) return malformed(`${end - at} stray bytes after the records`);
  return { root, fdTotal };
}

function decodeWithRecords(
  buf: Buffer,
  v: DataView,
  start: number,
  end: number,
  fds: number[],
  link: Link,
  leases: IncomingLeases | undefined,
): Decoded {
  const records: ParsedRecord[] = [];
  const parsed = parseRecords(buf, v, start, end, records);
  if ('ok' in parsed) return parsed;
  const { root, fdTotal } = parsed;
  if (fdTotal !== fds.length) return malformed(`records claim ${fdTotal} fds but ${fds.length} arrived`);

  // Lease ids: only on handler records, each new to this link, before anything is decoded.
  let leased = 0;
  for (const rec of records) {
    if (rec.leaseId === 0) continue;
    if (rec.kind === '@bigint' || rec.kind === '@typed-array') return malformed(`a leased '${rec.kind}' record`);
    if (!leases) return malformed('a leased value where no lease can be received');
    if (leases.isLive(rec.leaseId)) return malformed(`lease id ${rec.leaseId} is already held`);
    leased++;
  }
  if (leased > 1) {
    const ids = new Set<number>();
    for (const rec of records) {
      if (rec.leaseId === 0) continue;
      if (ids.has(rec.leaseId)) return malformed(`lease id ${rec.leaseId} appears twice`);
      ids.add(rec.leaseId);
    }
  }

  if (records.length === 1 && records[0]!.path.length === 0) return decodeSole(records[0]!, root, buf, fds, link, leases);

  // Check every placement before decoding anything, so a bad path never strands a decoded value.
  const holder: unknown[] = [root];
  const slots: Array<{ parent: Record<string | number, unknown>; key: Segment }> = [];
  for (const rec of records) {
    let parent: unknown = holder;
    let key: Segment = 0;
    for (const seg of rec.path) {
      const next = (parent as Record<string | number, unknown>)[key];
      if (typeof next !== 'object' || next === null) return malformed('a record path leads through a non-container');
      if (Array.isArray(next) !== (typeof seg === 'number')) return malformed('a record path does not match the JSON');
      parent = next;
      key = seg;
    }
    const p = parent as Record<string | number, unknown>;
    if (!Object.hasOwn(p, key) || p[key] !== null) return malformed('a record path does not point at a null placeholder');
    slots.push({ parent: p, key });
  }

  // From here every lease is open: a failure must end them all (the values that were decoded
  // end theirs when disposed; the rest never will), so that the sender gets its resources back.
  const received: Array<ReceivedLease | undefined> = records.map((rec) => (rec.leaseId !== 0 ? leases!.open(rec.leaseId) : undefined));
  const owned: object[] = [];
  let fdAt = 0;
  for (let i = 0; i < records.length; i++) {
    const rec = records[i]!;
    const mine = fds.slice(fdAt, fdAt + rec.fdCount);
    let value: unknown;
    try {
      value = decodeRecord(rec, buf, mine, link, received[i]);
    } catch (e) {
      // A handler marks the fds it already took or closed with -1; the rest are closed for it.
      for (let k = 0; k < rec.fdCount; k++) fds[fdAt + k] = mine[k]!;
      disposeValues(owned);
      for (const lease of received) lease?.end();
      return recordFailed(rec, e);
    }
    for (let k = fdAt; k < fdAt + rec.fdCount; k++) fds[k] = -1;  // handed over
    fdAt += rec.fdCount;
    if (rec.kind !== '@bigint' && rec.kind !== '@typed-array' && typeof value === 'object' && value !== null) owned.push(value);
    slots[i]!.parent[slots[i]!.key] = value;
  }
  return { ok: true, value: holder[0], owned: owned.length ? owned : undefined };
}

/**
 * A message that is one value (link.send(buffer)): its JSON must be null, the placeholder the
 * record replaces, and the record owns every fd. No placement to walk or make.
 */
function decodeSole(rec: ParsedRecord, root: unknown, buf: Buffer, fds: number[], link: Link, leases: IncomingLeases | undefined): Decoded {
  if (root !== null) return malformed('a record path does not point at a null placeholder');
  // The lease is open from here: if decoding fails, ending it gives the sender its resource back.
  const lease = rec.leaseId !== 0 ? leases!.open(rec.leaseId) : undefined;
  let value: unknown;
  try {
    // Every fd is this record's (the caller checked the count); on failure, those the handler did
    // not take (marked -1) are closed by the caller.
    value = decodeRecord(rec, buf, fds, link, lease);
  } catch (e) {
    lease?.end();
    return recordFailed(rec, e);
  }
  const owns = rec.kind !== '@bigint' && rec.kind !== '@typed-array' && typeof value === 'object' && value !== null;
  return { ok: true, value, owned: owns ? [value as object] : undefined };
}

/** What a message whose record `rec` could not be decoded fails with. */
function recordFailed(rec: ParsedRecord, e: unknown): Decoded {
  const error =
    e instanceof IpcError
      ? e
      : new IpcError('ERR_DESCRIPTOR_INVALID', `the '${rec.kind}' transfer handler could not rebuild a received value: ${String((e as Error)?.message ?? e)}`, { cause: e });
  return { ok: false, error, fatal: !!(e as { fatal?: boolean })?.fatal };
}

/** A plain Uint8Array (own, unpooled ArrayBuffer) holding buf[start, end). */
function copyBytes(buf: Uint8Array, start: number, end: number): Uint8Array {
  const out = new Uint8Array(Math.max(0, end - start));
  out.set(buf.subarray(start, end));
  return out;
}

function fatal(why: string): IpcError {
  return Object.assign(new IpcError('ERR_FRAME_INVALID', why), { fatal: true });
}

function decodeRecord(rec: ParsedRecord, buf: Buffer, fds: number[], link: Link, lease: ReceivedLease | undefined): unknown {
  if (rec.kind === '@bigint') {
    const text = buf.toString('latin1', rec.dataStart, rec.dataEnd);
    if (rec.fdCount !== 0 || !/^-?[0-9]{1,10000}$/.test(text)) throw fatal('received a malformed bigint record');
    return BigInt(text);
  }
  if (rec.kind === '@typed-array') {
    const tag = rec.dataEnd > rec.dataStart ? buf[rec.dataStart]! : 0;
    const Ctor = tag === DATA_VIEW_TAG ? DataView : TYPED_ARRAYS[tag];
    const bytes = rec.dataEnd - rec.dataStart - 1;
    if (rec.fdCount !== 0 || !Ctor || (Ctor !== DataView && bytes % (Ctor as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT !== 0)) {
      throw fatal('received a malformed typed-array record');
    }
    const copy = copyBytes(buf, rec.dataStart + 1, rec.dataEnd);
    if (Ctor === DataView) return new DataView(copy.buffer);
    return new (Ctor as Uint8ArrayConstructor)(copy.buffer as ArrayBuffer);
  }
  const handler = handlerForKind(rec.kind);
  if (!handler) {
    throw new IpcError(
      'ERR_NOT_TRANSFERABLE',
      `received a '${rec.kind}' but no transfer handler for it is registered in this process; import the module that ` +
        'provides it (the whole cuda-ipc package registers all of them) before receiving',
    );
  }
  probe?.(Probe.ImportStart);
  const value = handler.decode(new Uint8Array(buf.buffer, buf.byteOffset + rec.dataStart, rec.dataEnd - rec.dataStart), fds, link, lease);
  probe?.(Probe.ImportEnd);
  return value;
}
