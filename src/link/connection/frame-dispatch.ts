// The receiving side of a link: every record the transport reads (from the socket, or from this
// side's frame ring) is checked, decoded (inbound.ts) and acted on here: a message goes to the
// inbox, a RELEASE ends leases, the ring frames set up the rings, GONE goes to its handlers, and
// a HELLO, GOODBYE or REFUSE moves the link along. The Link keeps its state, the handshake and
// the close; this dispatcher reaches them through the narrow FrameDispatchParts it is given.
import { IpcError } from '../../errors.js';
import {
  ENCODING_MASK,
  FrameType,
  HEADER_BYTES,
  LARGE_PAYLOAD,
  MAX_FDS,
  MAX_FRAME_BYTES,
  RefuseReason,
  parseHeader,
  type FrameHeader,
} from '../transport/frame.js';
import { closeFds } from '../transport/fds.js';
import { dispatchGone } from '../lifetimes/gone.js';
import type { Inbox } from './inbox.js';
import { readPayload, type InboundContext, type InboundFrame } from './inbound.js';
import type { IncomingLeases, OutgoingLeases } from '../lifetimes/lease.js';
import type { LinkSender } from './link-sender.js';
import type { LinkState } from './link-types.js';
import { leaseIdsOf } from '../messages/message-decoder.js';
import { probe, Probe } from '../transport/probe.js';
import { RecordSource } from '../transport/unix-transport.js';
import type { FrameTransport } from '../transport/frame-transport.js';
import type { NcclAbort } from '../messages/nccl-abort.js';

/** What a FrameDispatch acts on: the parts of its link (link.ts's Link), and the link's own two steps it may take. */
export interface FrameDispatchParts {
  /** The link: its state, and what transfer and GONE handlers are given. */
  readonly link: { readonly state: LinkState };
  readonly sock: FrameTransport;
  readonly sender: LinkSender;
  readonly inbox: Inbox;
  /** Leases granted to the peer, which its RELEASE frames end. */
  readonly leasesOut: OutgoingLeases;
  /** Leases the peer granted, opened as messages are decoded. */
  readonly leasesIn: IncomingLeases;
  /** The largest message payload accepted (LinkLimits.maxMessageBytes). */
  readonly maxMessageBytes: number;
  /** For messages: who the peer is, e.g. "child process 1234". */
  readonly peerName: string;
  /** The peer's HELLO arrived, with the credentials the kernel attached to it (if asked to). */
  hello(cred: [number, number, number] | undefined, features: number): void;
  /** Closes the link: `reason` undefined for a clean close. */
  shutdown(reason: IpcError | undefined, by: 'local' | 'peer'): void;
  /** The peer aborted an NCCL communicator of the link (a TCP link): its hooks hear of it. */
  ncclAbort(abort: NcclAbort): void;
}

/** Acts on the records one link receives (see the module notes). */
export class FrameDispatch {
  readonly #link: { readonly state: LinkState };
  readonly #sock: FrameTransport;
  readonly #sender: LinkSender;
  readonly #inbox: Inbox;
  readonly #leasesOut: OutgoingLeases;
  readonly #leasesIn: IncomingLeases;
  readonly #peerName: string;
  readonly #parts: FrameDispatchParts;
  readonly #recvBuf: Buffer;
  readonly #recvView: DataView;
  readonly #header: FrameHeader = { type: FrameType.Hello, flags: 0, payloadLength: 0, fdCount: 0 };
  readonly #inbound: InboundContext;

  constructor(parts: FrameDispatchParts) {
    this.#parts = parts;
    this.#link = parts.link;
    this.#sock = parts.sock;
    this.#sender = parts.sender;
    this.#inbox = parts.inbox;
    this.#leasesOut = parts.leasesOut;
    this.#leasesIn = parts.leasesIn;
    this.#peerName = parts.peerName;
    this.#recvBuf = Buffer.from(parts.sock.recvBuffer);
    this.#recvView = new DataView(parts.sock.recvBuffer);
    this.#inbound = { link: parts.link, leases: parts.leasesIn, maxMessageBytes: parts.maxMessageBytes, transport: parts.sock.kind };
  }

  /**
   * Called by the transport for every record, with the bytes in its receive buffer [0, length)
   * (or in its ring buffer, for a frame that came through the frame ring).
   */
  record(status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined, source: RecordSource): void {
    probe?.(Probe.RecordIn);
    if (this.#link.state === 'closed') {
      closeFds(fds);
      return;
    }
    if (status !== 0) {
      if (status === 2 && this.#fdsLostHere(length)) return;
      this.#parts.shutdown(
        (status & 2) !== 0
          ? new IpcError('ERR_FDS_TRUNCATED', `the ${this.#peerName} sent a message with more fds than a link accepts; they were closed`)
          : new IpcError('ERR_FRAME_INVALID', `the ${this.#peerName} sent a record larger than ${MAX_FRAME_BYTES} bytes`),
        'local',
      );
      return;
    }
    const ring = source === RecordSource.Ring;
    const view = ring ? this.#sock.ringView : this.#recvView;
    let h: FrameHeader;
    try {
      h = parseHeader(view, length, fds?.length ?? 0, this.#header);
    } catch (e) {
      closeFds(fds);
      this.#parts.shutdown(e as IpcError, 'local');
      return;
    }
    if (h.type !== FrameType.Hello && h.type !== FrameType.Refuse && h.type !== FrameType.Goodbye && this.#link.state !== 'open') {
      closeFds(fds);
      const what = h.type === FrameType.Message ? 'message' : h.type === FrameType.Release ? 'RELEASE' : h.type === FrameType.Gone ? 'GONE'
        : h.type === FrameType.Ring ? 'RING' : h.type === FrameType.RingStart ? 'RING_START' : 'NCCL_ABORT';
      this.#parts.shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#peerName} sent a ${what} before the link handshake`), 'local');
      return;
    }
    let f: InboundFrame;
    try {
      f = readPayload(h, ring ? this.#sock.ringBuffer : this.#recvBuf, view, length, fds, this.#inbound);
    } catch (e) {
      // readPayload closed the fds. Anything but an IpcError would be a bug in the decoder; the
      // link still closes with a typed reason rather than throw out of the socket callback.
      const reason = e instanceof IpcError ? e : new IpcError('ERR_FRAME_INVALID', `could not decode a frame from the ${this.#peerName}: ${String((e as Error)?.message ?? e)}`, { cause: e });
      // A message over our limit is the one refusal the sender can act on: tell it why.
      if (reason.code === 'ERR_MESSAGE_TOO_LARGE') this.#sender.sendRefusal(RefuseReason.TooLarge, reason.message);
      this.#parts.shutdown(reason, 'local');
      return;
    }
    switch (f.type) {
      case FrameType.Message:
        probe?.(Probe.Delivered);
        this.#inbox.deliver(f.message, f.bytes, f.fds);
        return;
      case FrameType.Release: {
        const unknown = this.#leasesOut.release(f.ids);
        probe?.(Probe.ReleaseDone);
        this.#sender.maybeDrain();
        if (unknown !== undefined) {
          // A correct peer releases each lease it was given exactly once, so this is a broken or
          // hostile peer; closing (which ends every lease it holds) is the one safe answer.
          this.#parts.shutdown(
            new IpcError('ERR_FRAME_INVALID', `the ${this.#peerName} released lease ${unknown}, which this link never granted or had already ended`),
            'local',
          );
        }
        return;
      }
      case FrameType.Hello:
        this.#parts.hello(cred, f.features);
        return;
      case FrameType.Ring:
        try {
          if (!this.#sock.acceptOffer(f.capacity, f.fds)) return;
        } catch (e) {
          this.#parts.shutdown(e as IpcError, 'local');
          return;
        }
        try {
          this.#sender.sendControl(FrameType.RingStart);
        } catch {
          // The peer is already gone; the receive side reports it.
        }
        return;
      case FrameType.RingStart:
        try {
          this.#sock.startReceiving();
        } catch (e) {
          this.#parts.shutdown(e as IpcError, 'local');
        }
        return;
      case FrameType.Gone:
        dispatchGone(f.entries, this.#link);
        return;
      case FrameType.NcclAbort:
        // Only TCP links have NCCL communicators (PROTOCOL.md 8); a correct peer sends none elsewhere.
        if (this.#sock.kind !== 'tcp') this.#parts.shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#peerName} sent NCCL_ABORT on a Unix-socket link`), 'local');
        else this.#parts.ncclAbort(f.abort);
        return;
      case FrameType.Goodbye:
        this.#parts.shutdown(undefined, 'peer');
        return;
      case FrameType.Refuse:
        this.#parts.shutdown(
          f.reason === RefuseReason.TooLarge
            ? new IpcError('ERR_MESSAGE_TOO_LARGE', `the ${this.#peerName} closed the link on a message larger than it accepts: ${f.text}`, { limit: 'maxMessageBytes' })
            : f.reason === RefuseReason.Busy
              ? new IpcError('ERR_LISTENER_BUSY', `the ${this.#peerName} is busy: ${f.text}`)
              : new IpcError('ERR_PEER_REFUSED', `the ${this.#peerName} refused the link: ${f.text}`),
          'peer',
        );
        return;
    }
  }

  /**
   * A record arrived whole but without (some of) its fds, which the kernel closed (MSG_CTRUNC).
   * When its header is sound and announces no more fds than a record may carry, the fds were
   * lost here, because this process (or the system) had no descriptor left for them: that message
   * alone fails with ERR_FD_LIMIT and the leases it granted go back to the sender; the link, and
   * the process's other links, go on. Returns false for anything else (the caller closes the link).
   */
  #fdsLostHere(length: number): boolean {
    const v = this.#recvView;
    if (length < HEADER_BYTES) return false;
    const declared = v.getUint16(12, true);
    let h: FrameHeader;
    try {
      h = parseHeader(v, length, declared, this.#header);
    } catch {
      return false;
    }
    if (h.type !== FrameType.Message || declared === 0 || declared > MAX_FDS || this.#link.state !== 'open') return false;
    const error = new IpcError(
      'ERR_FD_LIMIT',
      `a message from the ${this.#peerName} carried ${declared} fds, and this process had no descriptor left for them ` +
        '(EMFILE/ENFILE: see `ulimit -n`); the message was dropped and its leases returned. Close buffers, links or channels you no longer need',
    );
    if ((h.flags & LARGE_PAYLOAD) !== 0) {
      // Its payload was in the lost memfd: which leases it granted is unknowable, so only closing
      // the link (which ends them all) gives them back.
      this.#parts.shutdown(error, 'local');
      return true;
    }
    const ids = (h.flags & ENCODING_MASK) === 2 ? leaseIdsOf(this.#recvBuf, HEADER_BYTES, length) : [];
    if (ids === undefined) return false;
    for (const id of ids) if (!this.#leasesIn.isLive(id)) this.#leasesIn.open(id).end();
    this.#inbox.deliver({ ok: false, error }, 0, 0);
    return true;
  }
}
