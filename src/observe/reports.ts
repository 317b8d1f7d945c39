// What the layers report to the status record (`cuda-ipc status` / `top`), as shapes: observe is a
// leaf, so the layers that report describe themselves through these interfaces and observe never
// imports them. Types only.

/** Device memory of the process, as cuda/buffer.ts counts it (deviceMemoryStats()). */
export interface DeviceMemoryStats {
  /** Allocations of this process (plain or pool) that are alive. */
  allocations: number;
  allocatedBytes: number;
  /** Of those, how many peers hold through leases, and the bytes they keep alive. */
  leased: number;
  leasedBytes: number;
  /** Bytes every buffer of which this process closed, kept only for peers' leases. */
  heldBytes: number;
  /** Memory mapped from other processes and still open here. */
  imports: number;
  importedBytes: number;
}

/** A link as the status record lists it: what link/connection/link.ts's Link shows of itself. */
export interface ObservedLink {
  /** Unique in this process. */
  readonly id: number;
  readonly closed: boolean;
  readonly state: 'handshaking' | 'open' | 'closed';
  /**
   * Throws while the peer is not known yet (before the handshake of a spawned child's parent
   * end), and on a TCP link, which knows no pid (see remote).
   */
  readonly peer: { readonly pid: number };
  /** What carries it: 'unix' (one machine) or 'tcp' (between machines). */
  readonly transport?: 'unix' | 'tcp';
  /** Where the peer of a TCP link is. */
  readonly remote?: { readonly address: string; readonly port: number; readonly family: string; readonly tls: boolean } | undefined;
  /** Leases this process holds for the peer. */
  readonly leases: { readonly count: number; readonly bytes: number };
  /** Messages waiting for room in the socket: the peer is not reading. */
  readonly sendQueue: { readonly messages: number; readonly bytes: number; readonly fds: number };
  /** Messages received and not yet consumed here; paused: reading stopped until they are. */
  readonly receiveQueue: { readonly messages: number; readonly bytes: number; readonly fds: number; readonly paused: boolean };
  /** Runs `hook` once when the link closes. */
  onClose(hook: () => void): unknown;
}

/** The received-lease count of a link, without reaching into it. */
export interface LeaseCount {
  readonly count: number;
}

/** Slot states of a channel, counted over its slots. */
export interface ChannelSlotCounts {
  free: number;
  /** Acquired by a producer, not yet published (optional: not every channel tells). */
  writing?: number;
  published: number;
  taken: number;
}

/** A process attached to a channel, as this end knows it. */
export interface ChannelPeerStatus {
  pid: number;
  role: 'producer' | 'consumer' | 'none';
  /** e.g. 'live', 'died', 'ended', 'detached'. */
  state: string;
}

/** What a channel end reports to `cuda-ipc status`: JSON data, cheap to make. */
export interface ChannelStatus {
  /** A label for people, e.g. the channel's id. */
  id: string;
  /** This end's role. */
  role: 'producer' | 'consumer' | 'none';
  topology?: string;
  memory: 'host' | 'device';
  slotBytes: number;
  slots: ChannelSlotCounts;
  peers: ChannelPeerStatus[];
}

/** A channel end that can be listed: snapshot() is called at most a few times a second. */
export interface ChannelStatusSource {
  snapshot(): ChannelStatus;
}

/** Returned by registerChannel(). */
export interface ChannelRegistration {
  /** A structural change (a peer attached, died, detached): refresh the record soon. */
  changed(): void;
  /** The channel closed: it is no longer listed. Idempotent. */
  unregister(): void;
}
