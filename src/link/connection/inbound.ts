// One received record turned into what the link acts on, with no socket involved: the link runs
// every record through here, and so does the frame fuzzer (test/fixtures/link-fuzzer.ts) with
// hostile bytes. Contract: return a frame, or throw an IpcError (the link must then close); in
// both cases every fd that came with the record is either inside a returned value or closed.
import type { IpcError } from '../../errors.js';
import { decodeMessage } from '../messages/message-decoder.js';
import { ENCODING_MASK, FrameType, HEADER_BYTES, LARGE_PAYLOAD, parseHeader, readGoneEntries, readReleaseIds, readU64, type FrameHeader, type GoneEntry } from '../transport/frame.js';
import type { IncomingLeases } from '../lifetimes/lease.js';
import { closeFd, closeFds } from '../transport/fds.js';
import { DEFAULT_MAX_MESSAGE_BYTES, checkLargeLength, checkMessageLength, readLargePayload } from '../transport/large-message.js';
import { readNcclAbort, type NcclAbort } from '../messages/nccl-abort.js';
import type { LinkTransportKind } from '../transport/frame-transport.js';

/** A received message: its value (and the decoded objects it owns), or why only it failed. */
export type ReceivedMessage =
  /** ready: delivered only once it resolves (DeferredValue); a rejection fails the message. */
  | { ok: true; value: unknown; owned: object[] | undefined; ready?: Promise<void> }
  | { ok: false; error: IpcError };

export type InboundFrame =
  | { type: FrameType.Hello; features: number }
  | { type: FrameType.Goodbye }
  | { type: FrameType.Refuse; reason: number; text: string }
  | { type: FrameType.Release; ids: number[] }
  | { type: FrameType.Gone; entries: GoneEntry[] }
  /** bytes: the payload's length; fds: how many of its fds the decoded values hold. */
  | { type: FrameType.Message; message: ReceivedMessage; bytes: number; fds: number }
  /** The peer's inbound ring: `fds` (its memfd, then its doorbell eventfd) belong to the caller. */
  | { type: FrameType.Ring; capacity: number; fds: [number, number] }
  | { type: FrameType.RingStart }
  /** The peer aborted an NCCL communicator of the link (TCP links; nccl-abort.ts). */
  | { type: FrameType.NcclAbort; abort: NcclAbort };

/** What decoding needs from the link the record arrived on. */
export interface InboundContext {
  /** The link the record arrived on, given to transfer handlers. */
  readonly link: object;
  /** Leases received from the peer; RELEASE frames for them go back through it. */
  readonly leases: IncomingLeases;
  /** The largest message payload accepted (default DEFAULT_MAX_MESSAGE_BYTES). */
  readonly maxMessageBytes?: number;
  /** What carries the link (default 'unix'): records of kinds it never carries fail their message. */
  readonly transport?: LinkTransportKind;
}

/** Longest REFUSE text kept (the rest is dropped). */
const REFUSE_TEXT_MAX = 1024;

/**
 * Reads the payload of a record whose header parseHeader() accepted: buf[0, length) is the whole
 * record, `view` a DataView over buf. Owns `fds` from the call on.
 */
export function readPayload(
  h: FrameHeader,
  buf: Buffer,
  view: DataView,
  length: number,
  fds: number[] | undefined,
  ctx: InboundContext,
): InboundFrame {
  switch (h.type) {
    case FrameType.Message: {
      if ((h.flags & LARGE_PAYLOAD) !== 0) return readLargeMessage(h, view, fds!, ctx);
      if (ctx.maxMessageBytes !== undefined && h.payloadLength > ctx.maxMessageBytes) {
        closeFds(fds);
        checkMessageLength(h.payloadLength, ctx.maxMessageBytes);
      }
      const d = decodeMessage(h.flags, buf, HEADER_BYTES, length, fds, ctx.link, ctx.leases, view, ctx.transport);
      if (d.ok) return { type: FrameType.Message, message: d, bytes: h.payloadLength, fds: h.fdCount };
      if (d.fatal) throw d.error;
      return { type: FrameType.Message, message: { ok: false, error: d.error }, bytes: 0, fds: 0 };
    }
    case FrameType.Ring:
      // parseHeader() checked there are exactly two; the caller owns them from here.
      return { type: FrameType.Ring, capacity: view.getUint32(HEADER_BYTES, true), fds: [fds![0]!, fds![1]!] };
    // parseHeader() allows fds only on messages and RING, so none need closing below.
    case FrameType.RingStart:
      return { type: FrameType.RingStart };
    case FrameType.Release:
      return { type: FrameType.Release, ids: readReleaseIds(view, h.payloadLength) };
    case FrameType.Gone:
      return { type: FrameType.Gone, entries: readGoneEntries(buf, view, h.payloadLength) };
    case FrameType.Refuse:
      return {
        type: FrameType.Refuse,
        reason: view.getUint16(HEADER_BYTES, true),
        text: buf.toString('utf8', HEADER_BYTES + 2, Math.min(length, HEADER_BYTES + 2 + REFUSE_TEXT_MAX)),
      };
    case FrameType.Hello:
      return { type: FrameType.Hello, features: view.getUint32(HEADER_BYTES, true) };
    case FrameType.NcclAbort:
      return { type: FrameType.NcclAbort, abort: readNcclAbort(buf, view, h.payloadLength) };
    case FrameType.Goodbye:
      return { type: FrameType.Goodbye };
  }
}

/**
 * A MESSAGE whose payload is in the memfd that came as its first fd (parseHeader() checked that
 * there is one and that the frame holds just the length): the length is checked, the payload
 * read and the memfd closed, then the payload is decoded as if it had come in the frame, with
 * the other fds.
 */
function readLargeMessage(h: FrameHeader, view: DataView, fds: number[], ctx: InboundContext): InboundFrame {
  const length = readU64(view, HEADER_BYTES);
  let payload: Buffer;
  try {
    checkLargeLength(length, ctx.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
    payload = readLargePayload(fds[0]!, length);
  } catch (e) {
    closeFds(fds);
    throw e;
  }
  closeFd(fds[0]!);
  const rest = fds.length > 1 ? fds.slice(1) : undefined;
  const d = decodeMessage(h.flags & ENCODING_MASK, payload, 0, length, rest, ctx.link, ctx.leases, undefined, ctx.transport);
  if (d.ok) return { type: FrameType.Message, message: d, bytes: length, fds: fds.length - 1 };
  if (d.fatal) throw d.error;
  return { type: FrameType.Message, message: { ok: false, error: d.error }, bytes: 0, fds: 0 };
}

/**
 * parseHeader() and readPayload() in one: the whole path a record takes, minus the link's state
 * checks. `buf` (and `view`) hold the record in [0, length).
 */
export function readFrame(
  buf: Buffer,
  view: DataView,
  length: number,
  fds: number[] | undefined,
  ctx: InboundContext,
  header: FrameHeader = { type: FrameType.Hello, flags: 0, payloadLength: 0, fdCount: 0 },
): InboundFrame {
  try {
    parseHeader(view, length, fds?.length ?? 0, header);
  } catch (e) {
    closeFds(fds);
    throw e;
  }
  return readPayload(header, buf, view, length, fds, ctx);
}
