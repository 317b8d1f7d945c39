// What a Link and its parts (link-sender.ts, frame-dispatch.ts, outbox.ts, socket-interest.ts)
// use of the thing that carries its frames: the native socket's face (send, setInterest, ref,
// close, a receive buffer and a callback per record), plus the frame rings' agreement. Two
// transports present it: the Unix socket with its optional frame rings (unix-transport.ts) and a
// TCP connection, optionally inside TLS (tcp-transport.ts). Types only.
import type { NativeSocket } from '../../native/posix-types.js';

/**
 * What carries a link: 'unix', a Unix socket between processes of one machine (fds and CUDA IPC
 * handles travel); 'tcp', a TCP connection (optionally TLS) between machines (bytes only).
 */
export type LinkTransportKind = 'unix' | 'tcp';

/** What the link learns from the transport about its frame rings (tests, status). */
export interface RingState {
  /** This side sends through the peer's ring. */
  readonly sending: boolean;
  /** This side reads its own ring. */
  readonly receiving: boolean;
}

/**
 * A link's transport. Records reach the link through the callback given at construction, with
 * their bytes in recvBuffer (RecordSource.Socket) or in the transport's own buffer, ringBuffer /
 * ringView (RecordSource.Ring: a frame-ring entry, or a TCP frame larger than recvBuffer).
 */
export interface FrameTransport extends NativeSocket {
  readonly kind: LinkTransportKind;
  /** The HELLO features this transport adds to the ones every link announces. */
  readonly features: number;
  /**
   * A message payload longer than a frame travels in the stream itself (TCP), not in a sealed
   * memfd (PROTOCOL.md 1.1 and 3.1).
   */
  readonly inlineLarge: boolean;
  readonly ringState: RingState;
  readonly ringBuffer: Buffer;
  readonly ringView: DataView;
  /** Once open: the RING frame offering this side's ring (fds borrowed until offerSent()), if both sides take rings. */
  offer(peerFeatures: number): { frame: Uint8Array; fds: number[] } | undefined;
  offerSent(): void;
  /** The peer's RING (fds owned from the call on): true when this side sends through it from its RING_START on. */
  acceptOffer(capacity: number, fds: [number, number]): boolean;
  /** The peer's RING_START arrived. */
  startReceiving(): void;
  /**
   * Where send() hands frames to a buffer of its own rather than to the kernel (TCP): resolves
   * once everything sent is in the kernel; undefined when it is already.
   */
  whenWritten?(): Promise<void> | undefined;
}
