// The link's wire format. Every SOCK_SEQPACKET record is one frame: a 16-byte header and a
// payload. All integers little-endian; reserved bytes are zero on send and checked on receive.
//
//   offset size  field
//   0      4     magic 0x4C504943 ("CIPL")
//   4      1     version (2: transfer records carry lease ids, RELEASE exists)
//   5      1     type: 1 HELLO, 2 MESSAGE, 3 GOODBYE, 4 REFUSE, 5 RELEASE, 6 GONE, 7 RING, 8 RING_START,
//                9 NCCL_ABORT
//   6      2     flags: MESSAGE only: bits 0-7 the payload encoding (Encoding), bit 8 the
//                payload is in the attached memfd (LARGE_PAYLOAD); 0 for other types
//   8      4     payload length: exactly the record length minus 16
//   12     2     fd count: exactly the number of fds that arrived with the record
//   14     2     reserved, 0
//
// Payloads: HELLO 8 bytes (u32 features: bit 0 = accepts large messages, bit 1 = accepts GONE,
// bit 2 = takes frame rings; bits a side does not know are ignored; u32 reserved = 0); GOODBYE
// empty; REFUSE u16 reason then UTF-8 text; MESSAGE see message-format.ts, or with LARGE_PAYLOAD
// set exactly 8 bytes, the u64 length of the payload that the sealed memfd attached as the first
// fd holds (large-message.ts); RELEASE (the receiver of leased values is done with them,
// lease.ts): u32 count (1..16381), u32 reserved = 0, then count u64 lease ids, each 1..2^53-1;
// exactly 8 + 8 * count bytes. GONE: gone.ts. RING (only between two sides whose HELLO set
// FEATURE_RING; frame-ring.ts): u32 capacity, u32 reserved = 0, and exactly 2 fds (the ring's
// memfd, the sender's doorbell eventfd); RING_START empty. NCCL_ABORT (TCP links only,
// nccl-abort.ts): 16-byte communicator id, u32 reason (1..3), u32 reserved = 0, UTF-8 text of at
// most 1024 bytes. Only MESSAGE and RING frames carry fds (and none on TCP links).
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';

export const FRAME_MAGIC = 0x4c504943;
export const FRAME_VERSION = 2;
export const HEADER_BYTES = 16;
/** Largest record (header included) a link sends or accepts. */
export const MAX_FRAME_BYTES = 128 * 1024;
export const MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - HEADER_BYTES;
/** What a header's u32 payload length can say: the largest message a TCP link carries inline. */
export const FRAME_MAX_PAYLOAD_LENGTH = 0xffff_ffff;
/** Most fds in one message. */
export const MAX_FDS: number = addon.posixConstants.MAX_FDS;

export const enum FrameType {
  Hello = 1,
  Message = 2,
  Goodbye = 3,
  Refuse = 4,
  Release = 5,
  /** Allocations the sender freed: drop what is cached of them (gone.ts). */
  Gone = 6,
  /** Offers the sender's inbound frame ring (frame-ring.ts): its memfd and doorbell. */
  Ring = 7,
  /** The sender's next frames go through the receiver's ring, in order (frame-ring.ts). */
  RingStart = 8,
  /** TCP links: the sender aborted an NCCL communicator of the link (nccl-abort.ts). */
  NcclAbort = 9,
}

export const enum Encoding {
  /** UTF-8 JSON; an empty payload is `undefined`. */
  Json = 0,
  /** The payload is the message: a Uint8Array. */
  Raw = 1,
  /** JSON followed by transfer records (message-format.ts). */
  JsonWithRecords = 2,
}

/** MESSAGE flags: the low byte is the Encoding. */
export const ENCODING_MASK = 0xff;
/** MESSAGE flag: the payload is not in the frame but in the sealed memfd sent as its first fd. */
export const LARGE_PAYLOAD = 0x100;
/** The inline payload of a LARGE_PAYLOAD message: the u64 length of the payload in the memfd. */
export const LARGE_INLINE_BYTES = 8;

export const HELLO_PAYLOAD_BYTES = 8;
/** RING: u32 capacity, u32 reserved; with the ring's memfd and the doorbell eventfd. */
export const RING_PAYLOAD_BYTES = 8;
export const RING_FDS = 2;
/** HELLO features: this side accepts LARGE_PAYLOAD messages. Unknown bits are ignored. */
export const FEATURE_LARGE_MESSAGES = 1;
/** HELLO features: this side accepts GONE frames. */
export const FEATURE_GONE = 2;
/**
 * HELLO features: this side takes frames through a shared-memory ring and sends through the
 * peer's (frame-ring.ts). Announced only where the link was made with rings on (unix-transport.ts).
 */
export const FEATURE_RING = 4;
/** HELLO features: this side takes device memory over NCCL (PROTOCOL.md 8); announced on TCP links. */
export const FEATURE_NCCL = 8;
/** The features this build always announces in its HELLO (FEATURE_RING, FEATURE_NCCL are added per transport). */
export const OUR_FEATURES = FEATURE_LARGE_MESSAGES | FEATURE_GONE;
/** GONE: u32 count and u32 reserved before the entries. */
export const GONE_HEAD_BYTES = 8;
/** Longest key of a GONE entry. */
export const MAX_GONE_KEY_BYTES = 1024;
/** RELEASE: u32 count and u32 reserved before the ids. */
export const RELEASE_HEAD_BYTES = 8;
/** NCCL_ABORT: 16-byte communicator id, u32 reason, u32 reserved, then at most 1024 bytes of text. */
export const NCCL_ABORT_HEAD_BYTES = 24;
export const NCCL_ABORT_TEXT_MAX = 1024;
/** Most ids in one RELEASE frame. */
export const MAX_RELEASE_IDS = Math.floor((MAX_PAYLOAD_BYTES - RELEASE_HEAD_BYTES) / 8);
export const enum RefuseReason {
  Uid = 1,
  Protocol = 2,
  /** A message was larger than the receiver's maxMessageBytes. */
  TooLarge = 3,
  /** The listener holds as many connections in their handshake as it takes (from this uid, or in all); try again later. */
  Busy = 4,
}

export interface FrameHeader {
  type: FrameType;
  flags: number;
  payloadLength: number;
  fdCount: number;
}

/** Writes a header at `view[0, 16)`. */
export function writeHeader(view: DataView, type: FrameType, flags: number, payloadLength: number, fdCount: number): void {
  view.setUint32(0, FRAME_MAGIC, true);
  view.setUint8(4, FRAME_VERSION);
  view.setUint8(5, type);
  view.setUint16(6, flags, true);
  view.setUint32(8, payloadLength, true);
  view.setUint16(12, fdCount, true);
  view.setUint16(14, 0, true);
}

export function invalid(why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `received an invalid link frame: ${why}; the peer is not speaking the cuda-ipc link protocol (or is a different version)`);
}

/**
 * Validates the header of a `length`-byte record that arrived with `fdCount` fds. Throws
 * ERR_FRAME_INVALID for anything out of spec. `out` is reused to avoid allocating per frame.
 */
export function parseHeader(view: DataView, length: number, fdCount: number, out: FrameHeader): FrameHeader {
  if (length < HEADER_BYTES) throw invalid(`${length} bytes is shorter than the ${HEADER_BYTES}-byte header`);
  const magic = view.getUint32(0, true);
  if (magic !== FRAME_MAGIC) throw invalid(`bad magic 0x${magic.toString(16)}`);
  const version = view.getUint8(4);
  if (version !== FRAME_VERSION) throw invalid(`protocol version ${version}, this build speaks ${FRAME_VERSION}`);
  const type = view.getUint8(5);
  const flags = view.getUint16(6, true);
  const payloadLength = view.getUint32(8, true);
  const declaredFds = view.getUint16(12, true);
  if (view.getUint16(14, true) !== 0) throw invalid('reserved header bytes are not zero');
  if (payloadLength !== length - HEADER_BYTES) throw invalid(`payload length ${payloadLength} does not match the ${length - HEADER_BYTES} bytes received`);
  if (declaredFds !== fdCount) throw invalid(`header announces ${declaredFds} fds but ${fdCount} arrived`);
  if (type === FrameType.Message) {
    const encoding = flags & ENCODING_MASK;
    if ((flags & ~(ENCODING_MASK | LARGE_PAYLOAD)) !== 0) throw invalid(`unknown message flags 0x${flags.toString(16)}`);
    if (encoding > Encoding.JsonWithRecords) throw invalid(`unknown message encoding ${encoding}`);
    // A large message's first fd is its payload; the others belong to its records.
    const large = (flags & LARGE_PAYLOAD) !== 0;
    if (large && (payloadLength !== LARGE_INLINE_BYTES || fdCount === 0)) {
      throw invalid(`a large message must carry an 8-byte length and its memfd (got ${payloadLength} bytes, ${fdCount} fds)`);
    }
    const recordFds = large ? fdCount - 1 : fdCount;
    if (recordFds > 0 && encoding !== Encoding.JsonWithRecords) throw invalid('fds arrived with a message that has no transfer records');
  } else if (type === FrameType.Ring) {
    if (flags !== 0) throw invalid(`flags 0x${flags.toString(16)} on a control frame`);
    if (payloadLength !== RING_PAYLOAD_BYTES) throw invalid(`RING payload of ${payloadLength} bytes`);
    if (fdCount !== RING_FDS) throw invalid(`RING with ${fdCount} fds, not ${RING_FDS}`);
    if (view.getUint32(HEADER_BYTES + 4, true) !== 0) throw invalid('RING reserved bytes are not zero');
  } else if (type === FrameType.NcclAbort) {
    if (flags !== 0) throw invalid(`flags 0x${flags.toString(16)} on a control frame`);
    if (fdCount !== 0) throw invalid('fds arrived with a control frame');
    if (payloadLength < NCCL_ABORT_HEAD_BYTES || payloadLength > NCCL_ABORT_HEAD_BYTES + NCCL_ABORT_TEXT_MAX) {
      throw invalid(`NCCL_ABORT payload of ${payloadLength} bytes (24 to ${NCCL_ABORT_HEAD_BYTES + NCCL_ABORT_TEXT_MAX})`);
    }
    const reason = view.getUint32(HEADER_BYTES + 16, true);
    if (reason < 1 || reason > 3) throw invalid(`NCCL_ABORT reason ${reason} (1..3)`);
    if (view.getUint32(HEADER_BYTES + 20, true) !== 0) throw invalid('NCCL_ABORT reserved bytes are not zero');
  } else if (type === FrameType.Hello || type === FrameType.Goodbye || type === FrameType.Refuse || type === FrameType.Release || type === FrameType.Gone || type === FrameType.RingStart) {
    if (flags !== 0) throw invalid(`flags 0x${flags.toString(16)} on a control frame`);
    if (fdCount !== 0) throw invalid('fds arrived with a control frame');
    if (type === FrameType.Hello) {
      if (payloadLength !== HELLO_PAYLOAD_BYTES) throw invalid(`HELLO payload of ${payloadLength} bytes`);
      if (view.getUint32(HEADER_BYTES + 4, true) !== 0) throw invalid('HELLO reserved bytes are not zero');
    }
    if (type === FrameType.Goodbye && payloadLength !== 0) throw invalid('GOODBYE with a payload');
    if (type === FrameType.RingStart && payloadLength !== 0) throw invalid('RING_START with a payload');
    if (type === FrameType.Refuse && payloadLength < 2) throw invalid('REFUSE without a reason');
    if (type === FrameType.Release) {
      const count = payloadLength >= RELEASE_HEAD_BYTES ? view.getUint32(HEADER_BYTES, true) : 0;
      if (count === 0 || count > MAX_RELEASE_IDS || payloadLength !== RELEASE_HEAD_BYTES + 8 * count) {
        throw invalid(`RELEASE of ${payloadLength} bytes announcing ${count} ids`);
      }
      if (view.getUint32(HEADER_BYTES + 4, true) !== 0) throw invalid('RELEASE reserved bytes are not zero');
    }
    if (type === FrameType.Gone) {
      const count = payloadLength >= GONE_HEAD_BYTES ? view.getUint32(HEADER_BYTES, true) : 0;
      if (count === 0) throw invalid(`GONE of ${payloadLength} bytes announcing no entries`);
      if (view.getUint32(HEADER_BYTES + 4, true) !== 0) throw invalid('GONE reserved bytes are not zero');
    }
  } else {
    throw invalid(`unknown frame type ${type}`);
  }
  out.type = type;
  out.flags = flags;
  out.payloadLength = payloadLength;
  out.fdCount = fdCount;
  return out;
}

/**
 * A u64 little-endian field read as a number (lease ids: 0 = no lease, else 1..2^53-1; the sizes
 * and offsets transfer handlers send), or -1 when it is too large for a safe integer.
 */
export function readU64(view: DataView, at: number): number {
  const high = view.getUint32(at + 4, true);
  return high >= 0x20_0000 ? -1 : high * 0x1_0000_0000 + view.getUint32(at, true);
}

/** Writes a safe non-negative integer as u64 little-endian at `at`. */
export function writeU64(view: DataView, at: number, n: number): void {
  view.setUint32(at, n % 0x1_0000_0000, true);
  view.setUint32(at + 4, Math.floor(n / 0x1_0000_0000), true);
}

/** A whole REFUSE frame: u16 `reason`, then `text` (its first 1000 characters, UTF-8). */
export function encodeRefuse(reason: RefuseReason, text: string): Uint8Array {
  const body = Buffer.from(text.slice(0, 1000));
  const frame = new Uint8Array(HEADER_BYTES + 2 + body.byteLength);
  const view = new DataView(frame.buffer);
  writeHeader(view, FrameType.Refuse, 0, 2 + body.byteLength, 0);
  view.setUint16(HEADER_BYTES, reason, true);
  frame.set(body, HEADER_BYTES + 2);
  return frame;
}

/**
 * A whole RELEASE frame for 1..MAX_RELEASE_IDS ids: in `scratch` (from its start) when it fits,
 * else in a new array. Returns the frame's bytes.
 */
export function encodeRelease(ids: readonly number[], scratch?: Uint8Array): Uint8Array {
  const length = HEADER_BYTES + RELEASE_HEAD_BYTES + 8 * ids.length;
  const frame = scratch && scratch.byteLength >= length ? scratch.subarray(0, length) : new Uint8Array(length);
  const view = new DataView(frame.buffer, frame.byteOffset, length);
  writeHeader(view, FrameType.Release, 0, length - HEADER_BYTES, 0);
  view.setUint32(HEADER_BYTES, ids.length, true);
  view.setUint32(HEADER_BYTES + 4, 0, true);
  for (let i = 0; i < ids.length; i++) writeU64(view, HEADER_BYTES + RELEASE_HEAD_BYTES + 8 * i, ids[i]!);
  return frame;
}

/** One entry of a GONE frame: an allocation of `kind` (a transfer record kind) named by `key`. */
export interface GoneEntry {
  kind: string;
  key: Uint8Array;
}

/**
 * GONE frames for `entries` (kind 1..64 printable ASCII, key at most MAX_GONE_KEY_BYTES), as few
 * as fit in frames of MAX_FRAME_BYTES:
 *   u32 count (>= 1) | u32 reserved (0) | entry * count
 *   entry = u8 kindLength (1..64) | kind (ASCII 0x21..0x7e) | u16 keyLength | key
 */
export function encodeGone(entries: readonly GoneEntry[]): Uint8Array[] {
  const frames: Uint8Array[] = [];
  let i = 0;
  while (i < entries.length) {
    let length = HEADER_BYTES + GONE_HEAD_BYTES;
    const first = i;
    while (i < entries.length) {
      const e = entries[i]!;
      const n = 1 + e.kind.length + 2 + e.key.byteLength;
      if (length + n > MAX_FRAME_BYTES && i > first) break;
      length += n;
      i++;
    }
    const frame = new Uint8Array(length);
    const view = new DataView(frame.buffer);
    writeHeader(view, FrameType.Gone, 0, length - HEADER_BYTES, 0);
    view.setUint32(HEADER_BYTES, i - first, true);
    let at = HEADER_BYTES + GONE_HEAD_BYTES;
    for (let k = first; k < i; k++) {
      const e = entries[k]!;
      frame[at++] = e.kind.length;
      for (let c = 0; c < e.kind.length; c++) frame[at++] = e.kind.charCodeAt(c);
      view.setUint16(at, e.key.byteLength, true);
      frame.set(e.key, at + 2);
      at += 2 + e.key.byteLength;
    }
    frames.push(frame);
  }
  return frames;
}

/** The entries of a GONE frame whose header parseHeader() accepted; ERR_FRAME_INVALID when malformed. */
export function readGoneEntries(buf: Uint8Array, view: DataView, payloadLength: number): GoneEntry[] {
  const end = HEADER_BYTES + payloadLength;
  const count = view.getUint32(HEADER_BYTES, true);
  if (count > payloadLength) throw invalid(`GONE announcing ${count} entries in ${payloadLength} bytes`);
  const out: GoneEntry[] = [];
  let at = HEADER_BYTES + GONE_HEAD_BYTES;
  for (let i = 0; i < count; i++) {
    if (at + 1 > end) throw invalid('truncated GONE entry');
    const kindLength = buf[at++]!;
    if (kindLength === 0 || kindLength > 64 || at + kindLength + 2 > end) throw invalid('bad GONE entry kind');
    let kind = '';
    for (let c = 0; c < kindLength; c++) {
      const ch = buf[at + c]!;
      if (ch < 0x21 || ch > 0x7e) throw invalid('GONE entry kind is not printable ASCII');
      kind += String.fromCharCode(ch);
    }
    at += kindLength;
    const keyLength = view.getUint16(at, true);
    at += 2;
    if (keyLength > MAX_GONE_KEY_BYTES || at + keyLength > end) throw invalid('GONE entry key past the end');
    out.push({ kind, key: buf.slice(at, at + keyLength) });
    at += keyLength;
  }
  if (at !== end) throw invalid(`${end - at} stray bytes after the GONE entries`);
  return out;
}

/** The ids of a RELEASE frame whose header parseHeader() accepted; ERR_FRAME_INVALID for bad ids. */
export function readReleaseIds(view: DataView, payloadLength: number): number[] {
  const count = (payloadLength - RELEASE_HEAD_BYTES) / 8;
  const ids = new Array<number>(count);
  for (let i = 0; i < count; i++) {
    const id = readU64(view, HEADER_BYTES + RELEASE_HEAD_BYTES + 8 * i);
    if (id <= 0) throw invalid('RELEASE of lease id 0 or of an id above 2^53');
    ids[i] = id;
  }
  return ids;
}
