// Encoding link messages: link.send(value) as a MESSAGE frame's payload, written into a scratch
// buffer that holds a whole frame (the format: message-format.ts). Values JSON cannot carry are
// found by one walk and travel as records: bigints, typed arrays, and objects a transfer handler
// sends (messages/handlers.ts), whose fds and lease holds the result hands to the link.
import { IpcError } from '../../errors.js';
import { Encoding, HEADER_BYTES, MAX_FDS, MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES, writeU64 } from '../transport/frame.js';
import { nextLeaseId, releaseHold, type LeaseHold } from '../lifetimes/lease.js';
import { handlerForValue, handlerOnOtherTransport, type RegisteredHandler } from './handlers.js';
import type { LinkTransportKind } from '../transport/frame-transport.js';
import { RECORD_TAIL_BYTES, typedArrayTag, type Segment } from './message-format.js';
import { closeFd } from '../transport/fds.js';
import { probe, Probe } from '../transport/probe.js';
import { invalidArgValue, invalidArgType, outOfRange, badNumber } from '../../arg-errors.js';

const MAX_DEPTH = 255;
/** A last record's data from this size on is sent from where it is, not copied into the scratch frame. */
const BODY_MIN_BYTES = 64 * 1024;

/** A value found by the scan that travels as a record. */
interface Found {
  path: Segment[];
  bigint?: bigint;
  view?: ArrayBufferView;
  handler?: RegisteredHandler;
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

const TRANSPORT_NAMES: Record<LinkTransportKind, string> = { unix: 'a Unix-socket link (one machine)', tcp: 'a TCP link (between machines)' };

/** `value`'s handler on `transport`; ERR_NOT_TRANSFERABLE when only handlers of other transports take it (naming what would do). */
function handlerOn(value: object, transport: LinkTransportKind, path: readonly Segment[]): RegisteredHandler | undefined {
  const h = handlerForValue(value, transport);
  if (h) return h;
  const other = handlerOnOtherTransport(value);
  if (!other) return undefined;
  const where = path.length ? ` at ${path.map((s) => (typeof s === 'number' ? `[${s}]` : `.${s}`)).join('')}` : '';
  const on = (other.transports ?? ['unix']).map((t) => TRANSPORT_NAMES[t]).join(' or ');
  const why = transport === 'tcp' ? ' (it passes fds or handles that mean nothing on another machine)' : '';
  throw new IpcError(
    'ERR_NOT_TRANSFERABLE',
    `link.send: cannot send ${articled((value as object).constructor?.name ?? 'object')}${where} on ${TRANSPORT_NAMES[transport]}: ` +
      `it travels as '${other.kind}', which only ${on} carries${why}. ` +
      (other.transportHint ?? (transport === 'tcp' ? 'Send its bytes instead (e.g. copied into a HostBuffer, which a TCP link carries as a copy)' : 'Send it on a link of that kind')),
  );
}

function articled(name: string): string {
  return `${/^[AEIOU]/i.test(name) ? 'an' : 'a'} ${name}`;
}

/**
 * Walks `v` looking for values JSON cannot carry. Returns `v` itself when its subtree has none,
 * otherwise a copy (made only along the paths that changed) with those values replaced by null.
 */
function scan(v: unknown, path: Segment[], found: Found[], transport: LinkTransportKind): unknown {
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
    throw invalidArgValue(`link.send: the message is nested deeper than ${MAX_DEPTH} levels (or contains a cycle)`);
  }
  if (Array.isArray(v)) {
    let copy: unknown[] | undefined;
    for (let i = 0; i < v.length; i++) {
      const e: unknown = v[i];
      if (e === null || (typeof e !== 'object' && typeof e !== 'bigint' && typeof e !== 'function' && typeof e !== 'symbol')) continue;
      path.push(i);
      const s = scan(e, path, found, transport);
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
      const s = scan(e, path, found, transport);
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
  const handler = handlerOn(v, transport, path);
  if (!handler) throw notTransferable(`an object of class ${(v as object).constructor?.name ?? 'unknown'} (no transfer handler is registered for it)`, path);
  found.push({ path: path.slice(), handler, value: v });
  return null;
}

/**
 * The transfer handler of `value` when the value itself travels as a record: an object that is
 * not a plain object, array or typed array (what scan() would hand to handlerForValue).
 */
function soleTransferable(value: unknown, transport: LinkTransportKind): RegisteredHandler | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || ArrayBuffer.isView(value)) return undefined;
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) return undefined;
  return handlerOn(value, transport, []);
}

/** How a message's size is bounded: the link's maxMessageBytes, or a frame (a peer without large messages). */
export interface MessageLimit {
  /** Most payload bytes. */
  readonly bytes: number;
  /** Says why, after "more than": e.g. "this link sends (maxMessageBytes 1073741824)". */
  readonly why: string;
  /** The option that sets it, for IpcError.limit. */
  readonly option: string;
}

/** A message must fit one frame: what an encoder used on its own (and a peer that only takes frames) allows. */
export const FRAME_LIMIT: MessageLimit = {
  bytes: MAX_PAYLOAD_BYTES,
  why: `a link frame holds (${MAX_PAYLOAD_BYTES})`,
  option: 'maxMessageBytes',
};

function tooLarge(bytes: number | string, limit: MessageLimit): IpcError {
  return new IpcError(
    'ERR_MESSAGE_TOO_LARGE',
    `link.send: the encoded message needs ${bytes} bytes, more than ${limit.why}; ` +
      'send bulk data in a HostBuffer (or a device buffer) and put the buffer in the message instead',
    { limit: limit.option },
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

/**
 * Encodes messages into a scratch buffer that holds a whole frame (header left to the caller), and
 * grows it for a larger message (up to the limit encode() is given); shrink() gives the growth back.
 */
export class MessageEncoder {
  scratch: Buffer = Buffer.allocUnsafeSlow(MAX_FRAME_BYTES);
  view = new DataView(this.scratch.buffer, this.scratch.byteOffset, MAX_FRAME_BYTES);
  /** Set while encoding, so that a re-entrant send (from a handler) takes another encoder. */
  busy = false;
  readonly #out: EncodedMessage = { encoding: Encoding.Json, headLength: 0, body: null, fds: [], ownedFds: [], commits: [], holds: [] };
  /** The bound of the encode in progress: scratch never grows past HEADER_BYTES + limit.bytes. */
  #limit: MessageLimit = FRAME_LIMIT;

  /**
   * Encodes `value` for `link` (passed on to transfer handlers), at most `limit.bytes` of payload
   * (default: one frame), with the transfer handlers that serve `transport` (the link's). The
   * result (and scratch) are valid until the next encode. A result longer than a frame
   * (headLength + body > MAX_FRAME_BYTES) is sent as a large message. If this throws, every fd a
   * handler handed over with closeFdsAfterSend has already been closed and every hold a handler
   * returned has been released.
   */
  encode(value: unknown, link: object, limit: MessageLimit = FRAME_LIMIT, transport: LinkTransportKind = 'unix'): EncodedMessage {
    const out = this.#out;
    this.#limit = limit;
    out.body = null;
    // (Setting an array's length is a runtime call even when it is 0 already.)
    if (out.fds.length) out.fds.length = 0;
    if (out.ownedFds.length) out.ownedFds.length = 0;
    if (out.commits.length) out.commits.length = 0;
    if (out.holds.length) out.holds.length = 0;
    if (value instanceof Uint8Array) {
      if (value.byteLength > limit.bytes) throw tooLarge(value.byteLength, limit);
      out.encoding = Encoding.Raw;
      out.headLength = HEADER_BYTES;
      out.body = value;
      return out;
    }
    const found: Found[] = [];
    // The commonest message with records is one transferable object (link.send(buffer)): its
    // JSON is null and its one record has an empty path, with no walk to find that out.
    const handler = soleTransferable(value, transport);
    const substitute = handler ? null : scan(value, [], found, transport);
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
      for (let i = 0; i < found.length; i++) at = this.#writeRecord(found[i]!, at, link, out, i === found.length - 1);
      out.headLength = at;
      return out;
    } catch (e) {
      for (const fd of out.ownedFds) closeFd(fd);
      out.ownedFds.length = 0;
      for (const { hold } of out.holds) releaseHold(hold);
      out.holds.length = 0;
      throw e;
    }
  }

  /** Makes room for `n` more bytes at `at` (growing scratch up to the limit); returns `at`. */
  #room(at: number, n: number): number {
    if (at + n > this.scratch.byteLength) this.#grow(at + n);
    return at;
  }

  /** Replaces scratch by one of at least `need` bytes holding the same first bytes. */
  #grow(need: number): void {
    const most = HEADER_BYTES + this.#limit.bytes;
    if (need > most) throw tooLarge(`at least ${need - HEADER_BYTES}`, this.#limit);
    const size = Math.min(most, Math.max(need, 2 * this.scratch.byteLength));
    const next = Buffer.allocUnsafeSlow(size);
    this.scratch.copy(next, 0, 0, this.scratch.byteLength);
    this.scratch = next;
    this.view = new DataView(next.buffer, next.byteOffset, size);
  }

  /** Gives back a scratch grown for a large message (call once its result is used). */
  shrink(): void {
    if (this.scratch.byteLength === MAX_FRAME_BYTES) return;
    this.scratch = Buffer.allocUnsafeSlow(MAX_FRAME_BYTES);
    this.view = new DataView(this.scratch.buffer, this.scratch.byteOffset, MAX_FRAME_BYTES);
  }

  #writeString(s: string, at: number): number {
    // Short ASCII (most keys, kinds and small JSON) is copied here: cheaper than the call into
    // Buffer.write. Anything else takes the general path.
    if (s.length <= 64 && at + s.length <= this.scratch.byteLength) {
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
    if (s.length * 3 > this.scratch.byteLength - at) {
      const n = Buffer.byteLength(s);
      if (at + n > HEADER_BYTES + this.#limit.bytes) throw tooLarge(n + at - HEADER_BYTES, this.#limit);
      this.#room(at, n);
    }
    return at + this.scratch.write(s, at, 'utf8');
  }

  #writeAscii(s: string, at: number): number {
    this.#room(at, 1 + s.length);
    this.scratch[at] = s.length;
    return this.#writeString(s, at + 1);  // kinds are ASCII (registerTransferHandler checks)
  }

  /**
   * Writes record `f` at `at`; returns where the next starts. The last record's data, when large,
   * is not copied: it becomes the message's body (read during send(), as a Raw message's is).
   */
  #writeRecord(f: Found, at: number, link: object, out: EncodedMessage, last: boolean): number {
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
          throw invalidArgType(`transfer handler '${kind}' returned a hold without a release() function`);
        }
        leaseId = nextLeaseId();
        out.holds.push({ id: leaseId, hold });
        const bytes = hold.bytes;
        if (bytes !== undefined && !(Number.isSafeInteger(bytes) && bytes >= 0)) {
          throw badNumber(bytes, `transfer handler '${kind}' returned a hold whose bytes (${String(bytes)}) is not a non-negative integer`);
        }
      }
      if (enc.onCommit) out.commits.push(enc.onCommit);
      data = enc.data;
      if (!(data instanceof Uint8Array)) throw invalidArgType(`transfer handler '${kind}' returned data that is not a Uint8Array`);
    }
    at = this.#writeAscii(kind, at);
    this.#room(at, 1);
    this.view.setUint8(at++, f.path.length);
    for (const seg of f.path) {
      if (typeof seg === 'number') {
        this.#room(at, 5);
        this.view.setUint8(at, 0);
        this.view.setUint32(at + 1, seg, true);
        at += 5;
      } else {
        this.#room(at, 3);
        this.view.setUint8(at, 1);
        const end = this.#writeString(seg, at + 3);
        if (end - at - 3 > 0xffff) throw outOfRange('link.send: an object key is longer than 65535 bytes');
        this.view.setUint16(at + 1, end - at - 3, true);
        at = end;
      }
    }
    const nfds = fds?.length ?? 0;
    if (out.fds.length + nfds > MAX_FDS) {
      throw new IpcError('ERR_MESSAGE_TOO_LARGE', `link.send: the message would carry more than ${MAX_FDS} fds; split it into several messages`);
    }
    if (fds) out.fds.push(...fds);
    const dataLength = data.byteLength + (tag ? 1 : 0);
    const asBody = last && data.byteLength >= BODY_MIN_BYTES;
    if (asBody && at + RECORD_TAIL_BYTES + dataLength - HEADER_BYTES > this.#limit.bytes) throw tooLarge(at + RECORD_TAIL_BYTES + dataLength - HEADER_BYTES, this.#limit);
    this.#room(at, RECORD_TAIL_BYTES + (asBody ? 1 : dataLength));
    const v = this.view;
    v.setUint8(at, nfds);
    writeU64(v, at + 1, leaseId);
    v.setUint32(at + 9, dataLength, true);
    at += RECORD_TAIL_BYTES;
    if (tag) v.setUint8(at++, tag);
    if (asBody) {
      out.body = data;
      return at;
    }
    this.scratch.set(data, at);
    return at + data.byteLength;
  }
}

const sharedEncoder = new MessageEncoder();
/** The process's encoder, or a fresh one when it is in use (a handler sending from encode()). */
export function acquireEncoder(): MessageEncoder {
  return sharedEncoder.busy ? new MessageEncoder() : sharedEncoder;
}
