// The sending side of a link: messages (encoded, checked against the lease bound, sent as a frame
// or as a large message's memfd), the control frames of the handshake, the close and the frame
// rings, RELEASE and GONE frames, and whether the peer is behind ('drain'). The Link owns one and
// keeps the state it reads here (open, closed) and the handshake that decides what to send.
import { IpcError } from '../../errors.js';
import { noteChange } from '../../observe/hooks.js';
import { closeFds } from '../transport/fds.js';
import {
  FRAME_MAX_PAYLOAD_LENGTH,
  FrameType,
  HEADER_BYTES,
  HELLO_PAYLOAD_BYTES,
  LARGE_INLINE_BYTES,
  LARGE_PAYLOAD,
  MAX_FDS,
  MAX_PAYLOAD_BYTES,
  OUR_FEATURES,
  encodeGone,
  encodeRefuse,
  writeHeader,
  writeU64,
  type GoneEntry,
  type RefuseReason,
} from '../transport/frame.js';
import { writeLargePayload } from '../transport/large-message.js';
import { releaseHold, type LeaseHold, type OutgoingLeases } from '../lifetimes/lease.js';
import type { LinkLimits } from './link-options.js';
import type { LinkState } from './link-types.js';
import { acquireEncoder, type MessageLimit } from '../messages/message-encoder.js';
import { Outbox, type WaitingReleases } from './outbox.js';
import { probe, Probe } from '../transport/probe.js';
import type { FrameTransport } from '../transport/frame-transport.js';
import type { SocketInterest } from '../transport/socket-interest.js';

// Sent frames are copied by the kernel, or by the outbox when they must wait: one scratch serves.
const releaseScratch = new Uint8Array(HEADER_BYTES + 8 + 8 * 64);
const largeScratch = new Uint8Array(HEADER_BYTES + LARGE_INLINE_BYTES);
const largeView = new DataView(largeScratch.buffer);

/** What a LinkSender needs of its link: its state, and the 'drain' event. Transfer handlers are given it too. */
export interface SendingLink {
  readonly state: LinkState;
  emit(event: 'drain'): boolean;
}

/** Sends for one link (link.ts's Link): messages, control frames, and 'drain' once the peer caught up. */
export class LinkSender {
  /** The frames waiting for room in the socket; the Link flushes it, drops it on close and drains it when writable. */
  readonly outbox: Outbox;
  readonly #link: SendingLink;
  readonly #sock: FrameTransport;
  readonly #leases: OutgoingLeases;
  readonly #limits: LinkLimits;
  readonly #peerName: string;
  /** What a message may hold: maxMessageBytes, or one frame for a peer without large messages. */
  #sendLimit: MessageLimit;
  /** send() returned false and 'drain' has not fired since. */
  #behind = false;
  #helloSent = false;
  #goodbyeSent = false;

  constructor(link: SendingLink, sock: FrameTransport, interest: SocketInterest, leases: OutgoingLeases, releases: WaitingReleases,
    limits: LinkLimits, peerName: string) {
    this.#link = link;
    this.#sock = sock;
    this.#leases = leases;
    this.#limits = limits;
    this.#peerName = peerName;
    this.#sendLimit = {
      bytes: limits.maxMessageBytes,
      why: `this link sends (maxMessageBytes ${limits.maxMessageBytes})`,
      option: 'maxMessageBytes',
    };
    this.outbox = new Outbox(sock, interest, peerName, limits.sendQueue, releases, () => this.maybeDrain());
  }

  /** Link.send on an open link: see its notes for what it returns and throws. */
  send(value: unknown): boolean {
    const enc = acquireEncoder();
    enc.busy = true;
    try {
      const m = enc.encode(value, this.#link, this.#sendLimit, this.#sock.kind);
      const payloadLength = m.headLength - HEADER_BYTES + (m.body?.byteLength ?? 0);
      let sent: boolean;
      try {
        if (m.fds.length > 0 && this.#sock.kind !== 'unix') this.#noFdsHere(m.ownedFds);
        if (m.holds.length > 0) this.#checkLeaseRoom(m.holds, m.ownedFds);
        if (payloadLength <= MAX_PAYLOAD_BYTES || this.#sock.inlineLarge) {
          // On TCP a message of any size is one frame in the stream (PROTOCOL.md 1.1); its length field is a u32.
          if (payloadLength > FRAME_MAX_PAYLOAD_LENGTH) this.#tooLongForAFrame(payloadLength, m.ownedFds);
          writeHeader(enc.view, FrameType.Message, m.encoding, payloadLength, m.fds.length);
          sent = this.outbox.send(enc.scratch, m.headLength, m.body, m.fds, m.ownedFds);
        } else {
          sent = this.#sendLarge(enc.scratch, m.headLength, m.body, m.encoding, payloadLength, m.fds, m.ownedFds);
        }
      } catch (e) {
        // Nothing was leased: the peer will never see these ids.
        for (const { hold } of m.holds) releaseHold(hold);
        throw e;
      }
      for (const { id, hold } of m.holds) this.#leases.add(id, hold);
      // Behind: the message waits in the queue, or the peer holds half the leases it may.
      if (!sent || this.#leasesHigh()) {
        if (!this.#behind) noteChange(); // `cuda-ipc status` lists what waits for the peer
        this.#behind = true;
        sent = false;
      }
      for (const commit of m.commits) {
        try {
          commit();
        } catch (e) {
          // The message is on its way; a handler's bookkeeping error must not read as a failed send.
          process.emitWarning(`a transfer handler's onCommit threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_TRANSFER_HANDLER' });
        }
      }
      return sent;
    } finally {
      enc.busy = false;
      enc.shrink();
    }
  }

  /** A transfer handler of a TCP link handed over fds (a handler that claims to serve it, wrongly): refused, closing `ownedFds`. */
  #noFdsHere(ownedFds: readonly number[]): never {
    closeFds(ownedFds);
    throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: a transfer handler passed fds for a message on a TCP link, which carries no fds (to the ${this.#peerName}); nothing was sent`);
  }

  #tooLongForAFrame(payloadLength: number, ownedFds: readonly number[]): never {
    closeFds(ownedFds);
    throw new IpcError(
      'ERR_MESSAGE_TOO_LARGE',
      `link.send: the encoded message needs ${payloadLength} bytes; a frame on a TCP link holds at most ${FRAME_MAX_PAYLOAD_LENGTH}; split it into several messages`,
      { limit: 'maxMessageBytes' },
    );
  }

  /** Throws ERR_LIMIT_REACHED (closing `ownedFds`) when `holds` would pass LinkOptions.leases. */
  #checkLeaseRoom(holds: ReadonlyArray<{ hold: LeaseHold }>, ownedFds: readonly number[]): void {
    const l = this.#limits.leases;
    let bytes = 0;
    let newFds: Set<object> | undefined; // fds these holds add (one buffer twice in a message counts once)
    for (const { hold } of holds) {
      bytes += hold.bytes ?? 0;
      if (this.#leases.addsFd(hold.fd)) (newFds ??= new Set()).add(hold.fd!);
    }
    const fds = newFds?.size ?? 0;
    const count = this.#leases.count;
    const over =
      count + holds.length > l.count ? { limit: 'leases.count', what: `${l.count} leases` }
      : this.#leases.bytes + bytes > l.bytes ? { limit: 'leases.bytes', what: `${l.bytes} bytes of leases` }
      : fds > 0 && this.#leases.fds + fds > l.fds ? { limit: 'leases.fds', what: `${l.fds} fds kept open by leases` }
      : undefined;
    if (!over) return;
    closeFds(ownedFds);
    throw new IpcError(
      'ERR_LIMIT_REACHED',
      `link.send: the ${this.#peerName} holds ${count} leases (${this.#leases.bytes} bytes, ${this.#leases.fds} fds) of what this link sent and has not ` +
        `released them; this message would pass the bound of ${over.what} (${over.limit}). Wait for 'drain' (send() returned false ` +
        'once the peer held half of it), make the peer close what it received, or raise the bound',
      { limit: over.limit },
    );
  }

  /** The peer holds at least half the leases (count, bytes or fds) the link allows. */
  #leasesHigh(): boolean {
    const l = this.#limits.leases;
    const o = this.#leases;
    return o.count * 2 >= l.count || o.bytes * 2 >= l.bytes || o.fds * 2 >= l.fds;
  }

  /** 'drain' once the link is no longer behind: the queue is empty and the peer below half its leases. */
  maybeDrain(): void {
    if (!this.#behind || this.#link.state === 'closed' || this.outbox.length > 0 || this.#leasesHigh()) return;
    this.#behind = false;
    noteChange();
    this.#link.emit('drain');
  }

  /**
   * Sends a payload too large for a frame (head[16, headLength) then body) in a sealed memfd,
   * attached before the records' fds. Closes `ownedFds` if it throws, as the outbox does.
   */
  #sendLarge(head: Uint8Array, headLength: number, body: Uint8Array | null, encoding: number, payloadLength: number, fds: readonly number[], ownedFds: readonly number[]): boolean {
    let fd: number;
    try {
      if (fds.length + 1 > MAX_FDS) {
        throw new IpcError('ERR_MESSAGE_TOO_LARGE', `link.send: a message larger than a frame carries its payload as one of its ${MAX_FDS} fds, and this one has ${fds.length} more; split it into several messages`, { limit: 'MAX_FDS' });
      }
      fd = writeLargePayload(head, HEADER_BYTES, headLength, body);
    } catch (e) {
      closeFds(ownedFds);
      throw e;
    }
    writeHeader(largeView, FrameType.Message, encoding | LARGE_PAYLOAD, LARGE_INLINE_BYTES, 1 + fds.length);
    writeU64(largeView, HEADER_BYTES, payloadLength);
    // The memfd's pages count against the queue's bytes while the message waits.
    return this.outbox.send(largeScratch, largeScratch.byteLength, null, [fd, ...fds], [fd, ...ownedFds], payloadLength);
  }

  /** The peer takes one frame per message (an older cuda-ipc): a larger send fails here, not at the peer. */
  limitToOneFrame(): void {
    this.#sendLimit = {
      bytes: Math.min(MAX_PAYLOAD_BYTES, this.#limits.maxMessageBytes),
      why: `the ${this.#peerName} accepts (${MAX_PAYLOAD_BYTES}, one frame: its cuda-ipc does not take larger messages)`,
      option: 'maxMessageBytes',
    };
  }

  /** Queues a control frame of `type` (never counted against the queue's bounds); throws once the peer is gone. */
  sendControl(type: FrameType, payload?: Uint8Array): void {
    const frame = new Uint8Array(HEADER_BYTES + (payload?.byteLength ?? 0));
    writeHeader(new DataView(frame.buffer), type, 0, payload?.byteLength ?? 0, 0);
    if (payload) frame.set(payload, HEADER_BYTES);
    this.outbox.send(frame, frame.byteLength, null, [], [], 0, true);
  }

  /** Sends GONE frames for `entries`; the Link checks first that the peer takes them. */
  sendGone(entries: readonly GoneEntry[]): void {
    for (const frame of encodeGone(entries)) this.outbox.send(frame, frame.byteLength, null, [], [], 0, true);
  }

  /** Queues an NCCL_ABORT frame (nccl-abort.ts); the Link checks first that the peer takes it. */
  sendNcclAbort(frame: Uint8Array): void {
    this.outbox.send(frame, frame.byteLength, null, [], [], 0, true);
  }

  /** Tells the peer that this process is done with the values it leased under `ids`. */
  sendRelease(ids: readonly number[]): void {
    if (this.#link.state !== 'open') return;
    probe?.(Probe.ReleaseSend);
    this.outbox.sendRelease(ids, releaseScratch);
  }

  /** Whether this side's HELLO went (or was attempted). */
  get helloSent(): boolean {
    return this.#helloSent;
  }

  /** Sends this side's HELLO, best effort: a peer already gone is reported by the receive side. */
  sendHello(): void {
    this.#helloSent = true;
    try {
      const hello = new Uint8Array(HELLO_PAYLOAD_BYTES);
      new DataView(hello.buffer).setUint32(0, OUR_FEATURES | this.#sock.features, true);
      this.sendControl(FrameType.Hello, hello);
    } catch (e) {
      // The peer is already gone; the receive side reports it.
    }
  }

  /** Once open: offers this side's frame ring when both HELLOs asked for rings. */
  offerRing(peerFeatures: number): void {
    let offer;
    try {
      offer = this.#sock.offer(peerFeatures);
    } catch (e) {
      // No ring (out of fds or memory): the link works on the socket alone.
      process.emitWarning(`a link could not set up its frame ring and uses its socket alone: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_LINK_RING' });
      return;
    }
    if (!offer) return;
    try {
      // A control frame: it never counts against the send queue's bounds.
      this.outbox.send(offer.frame, offer.frame.byteLength, null, offer.fds, [], 0, true);
    } catch {
      // The peer is already gone; the receive side reports it.
    }
    this.#sock.offerSent();
  }

  /**
   * For close(): a GOODBYE straight to the socket, best effort, once, and only after this side's
   * HELLO and when nothing waits in the queue (it would overtake what waits).
   */
  sayGoodbyeNow(): void {
    if (this.#goodbyeSent || this.outbox.length > 0 || !this.#helloSent) return;
    this.#goodbyeSent = true;
    const frame = new Uint8Array(HEADER_BYTES);
    writeHeader(new DataView(frame.buffer), FrameType.Goodbye, 0, 0, 0);
    try {
      this.#sock.send(frame, HEADER_BYTES, null, null);
    } catch {
      // The peer is gone already.
    }
  }

  /** For end(): queues a GOODBYE once, after this side's HELLO. Returns whether it queued one; throws once the peer is gone. */
  queueGoodbye(): boolean {
    if (this.#goodbyeSent || !this.#helloSent) return false;
    this.#goodbyeSent = true;
    this.sendControl(FrameType.Goodbye);
    return true;
  }

  /** A REFUSE with `reason` and `text` (at most 1024 bytes kept), straight to the socket, best effort. */
  sendRefusal(reason: RefuseReason, text: string): void {
    const frame = encodeRefuse(reason, text);
    try {
      this.#sock.send(frame, frame.byteLength, null, null);
    } catch {
      // The peer learns from the close either way.
    }
  }
}
