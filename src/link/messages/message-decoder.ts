// Decoding link messages: a MESSAGE frame's payload back into the value that was sent (the
// format: message-format.ts). Records are checked whole before any value is rebuilt, so that a
// malformed payload never strands a decoded value, an fd or a lease; transfer handlers
// (messages/handlers.ts) rebuild the objects that own resources.
import { IpcError } from '../../errors.js';
import { Encoding, readU64 } from '../transport/frame.js';
import type { IncomingLeases, ReceivedLease } from '../lifetimes/lease.js';
import { DeferredValue, handlerForKind, serves } from './handlers.js';
import type { LinkTransportKind } from '../transport/frame-transport.js';
import { DATA_VIEW_TAG, RECORD_TAIL_BYTES, TYPED_ARRAYS, type Segment } from './message-format.js';
import { closeFd } from '../transport/fds.js';
import { probe, Probe } from '../transport/probe.js';

export type Decoded =
  /** ready: the message is usable once it resolves (values still arriving, see DeferredValue). */
  | { ok: true; value: unknown; owned: object[] | undefined; ready?: Promise<void> }
  /** fatal: the payload is malformed (the link must close); otherwise only this message failed. */
  | { ok: false; error: IpcError; fatal: boolean };

/**
 * Deepest nesting of arrays and objects accepted in a received message's JSON, as on the Python
 * side (message_decoder.MAX_JSON_DEPTH): Python's json parses recursively, and Node's own
 * JSON.stringify of a value nested much deeper overflows its stack (a value delivered to the
 * application should not throw in the application's hands). Deeper: ERR_FRAME_INVALID, the link closes.
 */
export const MAX_JSON_DEPTH = 512;

/** Thrown by parseJson for JSON nested past MAX_JSON_DEPTH. */
class TooDeep extends Error {}

/**
 * Whether the JSON text buf[start, end) nests arrays and objects deeper than MAX_JSON_DEPTH,
 * brackets inside strings not counted (UTF-8: no multi-byte sequence holds an ASCII byte). One
 * pass, stopping at the first level past the bound.
 */
export function nestsTooDeep(buf: Uint8Array, start: number, end: number): boolean {
  let depth = 0;
  for (let i = start; i < end; i++) {
    const c = buf[i]!;
    if (c === 0x22) {
      // A string: skip to its closing quote (an escaped one does not close it).
      for (i++; i < end; i++) {
        const d = buf[i]!;
        if (d === 0x5c) i++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > MAX_JSON_DEPTH) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}

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

/**
 * The lease ids a JsonWithRecords payload buf[start, end) grants, without decoding anything (for
 * a message whose fds were lost on the way in: its leases must still go back), or undefined when
 * it is malformed.
 */
export function leaseIdsOf(buf: Buffer, start: number, end: number): number[] | undefined {
  const records: ParsedRecord[] = [];
  const parsed = parseRecords(buf, new DataView(buf.buffer, buf.byteOffset, buf.byteLength), start, end, records);
  if ('ok' in parsed) return undefined;
  const ids = records.filter((r) => r.leaseId !== 0).map((r) => r.leaseId);
  return new Set(ids).size === ids.length ? ids : undefined;
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
 * function from the call on: every fd ends up in a decoded value or closed). `link` is passed on
 * to transfer handlers; `leases` is the link's table of leases received from its peer; without
 * one (tests), a leased record is refused. `transport` is the link's: a record whose handler does
 * not serve it fails the message (a 'legacy-buffer' on a TCP link, a 'host-bytes' on a Unix one).
 * Never throws: a failure is returned, fatal when the payload is out of spec.
 */
export function decodeMessage(
  encoding: Encoding,
  buf: Buffer,
  start: number,
  end: number,
  fds: number[] | undefined,
  link: object,
  leases: IncomingLeases | undefined,
  view: DataView = new DataView(buf.buffer, buf.byteOffset, buf.byteLength),
  transport: LinkTransportKind = 'unix',
): Decoded {
  if (encoding === Encoding.Raw) return { ok: true, value: copyBytes(buf, start, end), owned: undefined };
  if (encoding === Encoding.Json) {
    if (start === end) return { ok: true, value: undefined, owned: undefined };
    try {
      return { ok: true, value: parseJson(buf, start, end), owned: undefined };
    } catch (e) {
      return malformed(e instanceof TooDeep ? e.message : 'the JSON does not parse');
    }
  }
  const all = fds ?? [];
  const r = decodeWithRecords(buf, view, start, end, all, link, leases, transport);
  // On failure every fd not taken by a handler (marked -1) is closed here.
  if (!r.ok) for (const fd of all) if (fd >= 0) closeFd(fd);
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
  // Nesting past the bound needs more than two bytes a level; shorter text is not checked.
  if (n > 2 * MAX_JSON_DEPTH && nestsTooDeep(buf, start, end)) throw new TooDeep(`the JSON nests deeper than ${MAX_JSON_DEPTH} levels`);
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
  } catch (e) {
    return malformed(e instanceof TooDeep ? e.message : 'the JSON does not parse');
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
    const leaseId = readU64(v, at + 1);
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
  link: object,
  leases: IncomingLeases | undefined,
  transport: LinkTransportKind,
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

  if (records.length === 1 && records[0]!.path.length === 0) return decodeSole(records[0]!, root, buf, fds, link, leases, transport);

  // Check every placement before decoding anything, so a bad path never strands a decoded value.
  const holder: unknown[] = [root];
  const slots: Array<{ parent: Record<string | number, unknown>; key: Segment }> = [];
  const placed = new Map<object, Set<Segment>>();
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
    // Two records for one placeholder: the second would replace the first value, stranding its fds.
    let taken = placed.get(p);
    if (!taken) placed.set(p, (taken = new Set()));
    if (taken.has(key)) return malformed('two records point at the same placeholder');
    taken.add(key);
    slots.push({ parent: p, key });
  }

  // From here every lease is open: a failure must end them all (the values that were decoded
  // end theirs when disposed; the rest never will), so that the sender gets its resources back.
  const received: Array<ReceivedLease | undefined> = records.map((rec) => (rec.leaseId !== 0 ? leases!.open(rec.leaseId) : undefined));
  const owned: object[] = [];
  const pending: Array<Promise<void>> = [];
  let fdAt = 0;
  for (let i = 0; i < records.length; i++) {
    const rec = records[i]!;
    const mine = fds.slice(fdAt, fdAt + rec.fdCount);
    let value: unknown;
    try {
      value = decodeRecord(rec, buf, mine, link, received[i], transport);
    } catch (e) {
      // A handler marks the fds it already took or closed with -1; the rest are closed for it.
      for (let k = 0; k < rec.fdCount; k++) fds[fdAt + k] = mine[k]!;
      disposeValues(owned);
      for (const lease of received) lease?.end();
      return recordFailed(rec, e);
    }
    for (let k = fdAt; k < fdAt + rec.fdCount; k++) fds[k] = -1;  // handed over
    fdAt += rec.fdCount;
    if (value instanceof DeferredValue) {
      pending.push(value.ready);
      value = value.value;
    }
    if (rec.kind !== '@bigint' && rec.kind !== '@typed-array' && typeof value === 'object' && value !== null) owned.push(value);
    slots[i]!.parent[slots[i]!.key] = value;
  }
  return { ok: true, value: holder[0], owned: owned.length ? owned : undefined, ...readiness(pending) };
}

/** A message's readiness: every deferred value's ready promise (none: usable at once). */
function readiness(pending: Array<Promise<void>>): { ready?: Promise<void> } {
  if (pending.length === 0) return {};
  return { ready: pending.length === 1 ? pending[0]! : Promise.all(pending).then(() => {}) };
}

/**
 * A message that is one value (link.send(buffer)): its JSON must be null, the placeholder the
 * record replaces, and the record owns every fd. No placement to walk or make.
 */
function decodeSole(rec: ParsedRecord, root: unknown, buf: Buffer, fds: number[], link: object, leases: IncomingLeases | undefined, transport: LinkTransportKind): Decoded {
  if (root !== null) return malformed('a record path does not point at a null placeholder');
  // The lease is open from here: if decoding fails, ending it gives the sender its resource back.
  const lease = rec.leaseId !== 0 ? leases!.open(rec.leaseId) : undefined;
  let value: unknown;
  try {
    // Every fd is this record's (the caller checked the count); on failure, those the handler did
    // not take (marked -1) are closed by the caller.
    value = decodeRecord(rec, buf, fds, link, lease, transport);
  } catch (e) {
    lease?.end();
    return recordFailed(rec, e);
  }
  let ready: Promise<void> | undefined;
  if (value instanceof DeferredValue) {
    ready = value.ready;
    value = value.value;
  }
  const owns = rec.kind !== '@bigint' && rec.kind !== '@typed-array' && typeof value === 'object' && value !== null;
  return { ok: true, value, owned: owns ? [value as object] : undefined, ...(ready ? { ready } : {}) };
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

function decodeRecord(rec: ParsedRecord, buf: Buffer, fds: number[], link: object, lease: ReceivedLease | undefined, transport: LinkTransportKind): unknown {
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
  if (!serves(handler, transport)) {
    throw new IpcError(
      'ERR_NOT_TRANSFERABLE',
      `received a '${rec.kind}' on a ${transport === 'tcp' ? 'TCP' : 'Unix-socket'} link, which never carries that kind (PROTOCOL.md 1.1); the message was dropped`,
    );
  }
  probe?.(Probe.ImportStart);
  const value = handler.decode(new Uint8Array(buf.buffer, buf.byteOffset + rec.dataStart, rec.dataEnd - rec.dataStart), fds, link, lease);
  probe?.(Probe.ImportEnd);
  return value;
}
