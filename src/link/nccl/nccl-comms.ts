// The NCCL communicators of TCP links (docs/PROTOCOL.md 8.1, 8.4). A sender makes one per link and
// device (rank 0 of 2; its unique id rides in the first record that names it), or one for a
// broadcast over several links (rank 0 of 1 + N); a receiver joins each with the rank the record
// gives it, on the link's working device. Transfers on a communicator run in sequence order on
// both sides (NCCL matches operations by order: `TransferOrder`, nccl-order.ts).
//
// Ending: the link closing for any reason aborts its communicators (a broadcast's for every link
// of it); so does an error NCCL reports while a transfer runs (polled with ncclCommGetAsyncError)
// or a transfer this side cannot take, which also tells the peer (NCCL_ABORT). Transfers still
// queued fail with the reason, and what they allocated is freed by their owners' fail hooks.
import { randomBytes } from 'node:crypto';
import { defaultDevice, type Device } from '../../cuda/device.js';
import { Stream } from '../../cuda/stream.js';
import { IpcError } from '../../errors.js';
import { NcclCommunicator } from '../../nccl/communicator.js';
import { loadNccl, loadNcclSync, loadedNcclLibrary } from '../../nccl/library.js';
import { asNcclUniqueId, type NcclUniqueId } from '../../nccl/unique-id.js';
import type { Link } from '../connection/link.js';
import type { NcclAbort, NcclAbortReason } from '../messages/nccl-abort.js';
import type { CommReference } from '../messages/nccl-records.js';
import type { TransferEncoding } from '../messages/handlers.js';
import { linkWorkingDevice } from '../connection/working-device.js';
import { TransferOrder, type Queued } from './nccl-order.js';

export type { Queued } from './nccl-order.js';

/** How often a communicator with work in flight is asked for asynchronous errors. */
const ERROR_POLL_MS = 100;

const hex = (b: Uint8Array): string => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('hex');

/** One communicator of one or more TCP links, as this side sees it. */
export class LinkComm {
  /** The id every record names it by. */
  readonly id: Uint8Array;
  readonly key: string;
  readonly device: Device;
  readonly nranks: number;
  /** This side's rank (0: the sender). */
  readonly rank: number;
  /** Chunks are broadcasts (else sends from rank 0 to rank 1). */
  readonly broadcast: boolean;
  /** The unique id, on the side that made it (rank 0). */
  readonly uniqueId: NcclUniqueId | undefined;
  /** Per-communicator state of the layers above (the tensors' chunk mover), closed with it. */
  readonly extras = new Map<string, { close(): Promise<void> | void }>();
  readonly #order: TransferOrder;
  readonly #links = new Set<Link>();
  #comm: Promise<NcclCommunicator> | undefined;
  #resolved: NcclCommunicator | undefined;
  #ended: IpcError | undefined;
  #poll: NodeJS.Timeout | undefined;
  #stream: Stream | undefined;
  /** Aborted with the communicator: a pending init gives up. */
  readonly #giveUp = new AbortController();
  /** Sender: the next sequence number to hand out. Receiver: the one the next record must carry. */
  sequence = 0;

  constructor(id: Uint8Array, device: Device, nranks: number, rank: number, broadcast: boolean, uniqueId: NcclUniqueId | undefined) {
    this.id = id;
    this.key = hex(id);
    this.device = device;
    this.nranks = nranks;
    this.rank = rank;
    this.broadcast = broadcast;
    this.uniqueId = uniqueId;
    this.#order = new TransferOrder(() => this.#stopPolling());
  }

  get ended(): IpcError | undefined {
    return this.#ended;
  }

  /** The stream every NCCL operation of this communicator runs on (one stream: NCCL's operations on a
   * communicator must not overtake each other). */
  get stream(): Stream {
    if (this.#ended) throw this.#ended;
    return (this.#stream ??= Stream.create(this.device));
  }

  /** Starts making the NCCL communicator (once); resolves when every rank joined. */
  start(uniqueId: NcclUniqueId): Promise<NcclCommunicator> {
    this.#comm ??= (async () => {
      const library = await loadNccl();
      if (this.#ended) throw this.#ended;
      // A peer that dies before it joined never completes the init: abort() gives up on it.
      const comm = await NcclCommunicator.init({ uniqueId, nranks: this.nranks, rank: this.rank, device: this.device, library, signal: this.#giveUp.signal });
      this.#resolved = comm;
      if (this.#ended) {
        void comm.abort();
        throw this.#ended;
      }
      return comm;
    })();
    // A failure to make it ends it (and tells the peers), unless it ended first.
    this.#comm.catch((e: unknown) => this.abort(asIpcError(e, 'making the NCCL communicator'), 3));
    return this.#comm;
  }

  /** The communicator, once made (start() ran). */
  communicator(): Promise<NcclCommunicator> {
    if (this.#ended) return Promise.reject(this.#ended);
    if (!this.#comm) return Promise.reject(new IpcError('ERR_INVALID_STATE', 'the NCCL communicator was not started'));
    return this.#comm;
  }

  /** Runs `start` in `sequence`'s turn (see TransferOrder); polls NCCL's errors while work is in flight. */
  submit(sequence: number, start: (comm: NcclCommunicator) => Promise<Queued>, fail: (error: IpcError) => void): void {
    this.#order.submit(sequence, async () => {
      try {
        const comm = await this.communicator();
        this.#startPolling();
        return await start(comm);
      } catch (e) {
        // A transfer that could not be queued leaves the two sides out of step: the communicator ends.
        const error = asIpcError(e, 'queueing an NCCL transfer');
        this.abort(error, 2);
        fail(this.#ended ?? error);
        throw error;
      }
    }, fail);
  }

  /** A transfer that starts when its consumer asks (or a later one needs the way): see TransferOrder.defer. */
  defer(sequence: number, force: () => void, fail: (error: IpcError) => void): void {
    this.#order.defer(sequence, force, fail);
  }

  /** @internal The links it spans (a broadcast spans several). */
  addLink(link: Link): void {
    this.#links.add(link);
  }

  /**
   * Ends the communicator here: NCCL work is cut short (ncclCommAbort), waiting transfers fail with
   * `reason`, and with `tell` the peers learn why (NCCL_ABORT on every open link it spans).
   */
  abort(reason: IpcError, tell?: NcclAbortReason): void {
    if (this.#ended) return;
    this.#ended = reason;
    this.#stopPolling();
    this.#giveUp.abort(reason);
    this.#order.fail(reason);
    for (const link of this.#links) {
      forget(link, this);
      if (tell && !link.closed) {
        try {
          link.sendNcclAbort(this.id, tell, reason.message);
        } catch {
          // The link is going: the peer learns from its close.
        }
      }
    }
    const comm = this.#comm;
    void (async () => {
      // Abort first: it ends NCCL's kernels, so the streams the extras wait for drain.
      if (this.#resolved) await this.#resolved.abort().catch(() => {});
      else if (comm) await comm.then((c) => c.abort(), () => {}).catch(() => {});
      for (const x of this.extras.values()) await Promise.resolve(x.close()).catch(() => {});
      this.extras.clear();
      const stream = this.#stream;
      this.#stream = undefined;
      if (stream) await stream.synchronize().catch(() => {}).finally(() => stream.close());
    })();
  }

  #startPolling(): void {
    if (this.#poll || this.#ended) return;
    this.#poll = setInterval(() => {
      const c = this.#resolved;
      if (!c || c.closed) return;
      const state = c.asyncError();
      if (state !== 'ncclSuccess' && state !== 'ncclInProgress') {
        this.abort(new IpcError('ERR_NCCL', `NCCL reported ${state} on the communicator of this link's transfers (${this.#peerText()}); the transfers in flight failed, a later transfer makes a new communicator`), 2);
      }
    }, ERROR_POLL_MS);
    this.#poll.unref();
  }

  #stopPolling(): void {
    clearInterval(this.#poll);
    this.#poll = undefined;
  }

  #peerText(): string {
    return [...this.#links].map((l) => (l.remote ? `${l.remote.address}:${l.remote.port}` : `link #${l.id}`)).join(', ');
  }
}

function asIpcError(e: unknown, what: string): IpcError {
  return e instanceof IpcError ? e : new IpcError('ERR_NCCL', `${what} failed: ${String((e as Error)?.message ?? e)}`, { cause: e });
}

/** The communicators of each link by id, and the one it sends on per device. */
interface LinkState {
  readonly byId: Map<string, LinkComm>;
  readonly outgoing: Map<Device, LinkComm>;
  /** Transfers this side sent on the link whose NCCL work has not settled (end() waits for them). */
  readonly sending: Set<Promise<void>>;
}
const states = new WeakMap<Link, LinkState>();

function stateOf(link: Link): LinkState {
  let s = states.get(link);
  if (s) return s;
  if (link.transport !== 'tcp') throw new IpcError('ERR_UNSUPPORTED', 'NCCL transfers run on TCP links only (a Unix link shares the memory itself)');
  s = { byId: new Map(), outgoing: new Map(), sending: new Set() };
  states.set(link, s);
  const state = s;
  link.onNcclAbort((a: NcclAbort) => {
    const comm = state.byId.get(hex(a.id));
    if (!comm) return;  // already ended here (or never known): nothing to do
    const why = a.reason === 1 ? 'could not take a transfer' : a.reason === 2 ? 'saw NCCL fail' : 'could not make the communicator';
    comm.abort(new IpcError('ERR_NCCL', `the peer ${why} and aborted this link's NCCL communicator: ${a.text}`));
  });
  link.onDrain(async () => {
    while (state.sending.size > 0) await Promise.all([...state.sending]);
  });
  link.onClose((_l, reason) => {
    const why = reason ?? new IpcError('ERR_LINK_CLOSED', 'the link closed before its NCCL transfers finished');
    for (const comm of [...state.byId.values()]) comm.abort(why);
  });
  return s;
}

function forget(link: Link, comm: LinkComm): void {
  const s = states.get(link);
  if (!s) return;
  if (s.byId.get(comm.key) === comm) s.byId.delete(comm.key);
  if (s.outgoing.get(comm.device) === comm) s.outgoing.delete(comm.device);
}

/**
 * Device memory over NCCL on a tls:// link crosses NCCL's network in clear, outside TLS: refused
 * (ERR_NCCL_UNENCRYPTED) unless the link allows it (LinkOptions.allowNcclInClear).
 */
export function checkNcclInClear(link: Link, what: 'send' | 'receive'): void {
  if (!link.remote?.tls || link.limits.allowNcclInClear) return;
  const how = 'NCCL does not encrypt: device memory would cross its network (sockets, InfiniBand, RoCE) in clear, outside TLS';
  throw new IpcError('ERR_NCCL_UNENCRYPTED', what === 'send'
    ? `link.send: this tls:// link moves device memory over NCCL, and ${how}. Pass { allowNcclInClear: true } to connect()/listen() ` +
      '(allow_nccl_in_clear=True in Python) where that network is trusted, or send a HostBuffer copy of the bytes (it travels inside TLS)'
    : `the peer sent device memory on this tls:// link, which moves over NCCL, and ${how}; this side does not allow it, so the message ` +
      'was dropped and the sender told (NCCL_ABORT). Pass { allowNcclInClear: true } to connect()/listen() (allow_nccl_in_clear=True in Python) ' +
      'where that network is trusted');
}

/** Why NCCL could not be loaded for a peer's record, and under which CUDA_IPC_NCCL_LIBRARY: searched once, not once per record. */
let ncclMissing: { env: string | undefined; error: IpcError } | undefined;

/** NCCL for a received record: the library loaded already, else one search (loadNcclSync), whose failure is remembered. */
function ncclForIncoming(): void {
  if (loadedNcclLibrary()) return;
  const env = process.env.CUDA_IPC_NCCL_LIBRARY;
  if (ncclMissing && ncclMissing.env === env) throw ncclMissing.error;
  try {
    loadNcclSync();
  } catch (e) {
    ncclMissing = { env, error: asIpcError(e, 'loading NCCL') };
    throw ncclMissing.error;
  }
}

/** Starts loading NCCL in the background, so that a first send of device memory need not wait for it. */
export function preloadNccl(): void {
  loadNccl().catch(() => {
    // A send that needs it says why it is missing.
  });
}

/**
 * The communicator `link` sends device memory of `device` on: rank 0 of 2, made on first use. Its
 * NCCL side starts once a record naming it went out (`committed`).
 */
function outgoingComm(link: Link, device: Device): LinkComm {
  const s = stateOf(link);
  let comm = s.outgoing.get(device);
  if (comm && !comm.ended) return comm;
  comm = newRootComm(device, 2, false);
  comm.addLink(link);
  s.outgoing.set(device, comm);
  s.byId.set(comm.key, comm);
  return comm;
}

/**
 * @internal A communicator this side makes as rank 0 of `nranks` on `device` (a link's own, or a
 * Fanout's broadcast): a fresh id, and a unique id for the records to carry. Loads NCCL if needed.
 */
export function newRootComm(device: Device, nranks: number, broadcast: boolean): LinkComm {
  const library = loadNcclSync();
  device.activate();
  return new LinkComm(randomBytes(16), device, nranks, 0, broadcast, library.uniqueId());
}

/** @internal Registers a communicator this side made for a broadcast over several links. */
export function addBroadcastComm(link: Link, comm: LinkComm): void {
  stateOf(link).byId.set(comm.key, comm);
  comm.addLink(link);
}

/** Which uniqueIds went out on which link: the first record naming a communicator on a link carries it. */
const announced = new WeakMap<Link, Set<string>>();
/** ... or go in the message being encoded (its later records naming the same communicator must not carry it again). */
const announcing = new WeakMap<Link, Set<string>>();

/** The reference a record names `comm` by on `link` for the receiver of `rank`. */
function commReference(link: Link, comm: LinkComm, rank: number): CommReference {
  const sent = (announced.get(link)?.has(comm.key) ?? false) || (announcing.get(link)?.has(comm.key) ?? false);
  if (!sent) {
    let pending = announcing.get(link);
    if (!pending) announcing.set(link, (pending = new Set()));
    pending.add(comm.key);
  }
  return { id: comm.id, nranks: comm.nranks, rank, broadcast: comm.broadcast, uniqueId: sent ? undefined : comm.uniqueId };
}

/** A record naming `comm` went out on `link`: later ones there need not carry its unique id, and its NCCL side starts. */
function committedOn(link: Link, comm: LinkComm): void {
  let sent = announced.get(link);
  if (!sent) announced.set(link, (sent = new Set()));
  sent.add(comm.key);
  announcing.get(link)?.delete(comm.key);
  comm.start(comm.uniqueId!);
}

/** The message naming `comm` did not go out on `link`: the next one carries its unique id again (if it had to). */
function notSent(link: Link, comm: LinkComm): void {
  announcing.get(link)?.delete(comm.key);
}

/**
 * The communicator a received record names (joining it if the record carries its unique id), on
 * the link's working device, and the transfer's place in its order. Throws ERR_FRAME_INVALID (the
 * message fails) for a record that names an unknown communicator, contradicts what an earlier one
 * said, or skips a sequence number; the communicator is then aborted and the peer told.
 */
export function incomingComm(link: Link, ref: CommReference, sequence: number): LinkComm {
  try {
    checkNcclInClear(link, 'receive');
  } catch (e) {
    try {
      link.sendNcclAbort(ref.id, 1, (e as Error).message);
    } catch {
      // The link is going: the peer learns from its close.
    }
    throw e;
  }
  const s = stateOf(link);
  const key = hex(ref.id);
  let comm = s.byId.get(key);
  if (!comm) {
    if (!ref.uniqueId) throw new IpcError('ERR_FRAME_INVALID', 'a received NCCL record names a communicator this link does not know, without its unique id');
    let device: Device;
    try {
      // No NCCL (or no device to receive on): this message fails with ERR_NCCL_UNAVAILABLE (or the
      // device's error) and the sender learns it (PROTOCOL.md 8.4), as on the Python side.
      ncclForIncoming();
      device = linkWorkingDevice(link) ?? defaultDevice();
    } catch (e) {
      const error = asIpcError(e, 'receiving device memory over NCCL');
      try {
        link.sendNcclAbort(ref.id, 1, error.message);
      } catch {
        // The link is going: the peer learns from its close.
      }
      throw error;
    }
    comm = new LinkComm(ref.id.slice(), device, ref.nranks, ref.rank, ref.broadcast, undefined);
    comm.addLink(link);
    s.byId.set(key, comm);
    comm.start(asNcclUniqueId(ref.uniqueId));
  } else if (ref.uniqueId || comm.nranks !== ref.nranks || comm.rank !== ref.rank || comm.broadcast !== ref.broadcast || comm.uniqueId) {
    const error = new IpcError('ERR_FRAME_INVALID', 'a received NCCL record contradicts an earlier one about its communicator (its rank, size, mode or unique id)');
    comm.abort(error, 1);
    throw error;
  }
  if (sequence !== comm.sequence) {
    const error = new IpcError('ERR_FRAME_INVALID', `a received NCCL transfer is number ${sequence} on its communicator, ${comm.sequence} was next`);
    comm.abort(error, 1);
    throw error;
  }
  comm.sequence++;
  return comm;
}

// ------------------------------------------------------------------------------------------------
// Sending: one transfer's place on a communicator, alone or as part of a Fanout.

/** What a handler's encode gets for one NCCL transfer it sends. */
export interface OutgoingTransfer {
  readonly comm: LinkComm;
  readonly sequence: number;
  /** How the record names the communicator on this link. */
  readonly reference: CommReference;
  /**
   * The message went out: queue the NCCL work in its turn. Resolves once it is done or failed.
   * Until then and until released(), link.end() waits for it.
   */
  committed(start: (comm: NcclCommunicator) => Promise<Queued>): Promise<void>;
  /**
   * The peer released the value (its bytes arrived there, or it gave up on them), or the link
   * closed. A send that finished here may still be on its way (NCCL buffers the last bytes): only
   * the peer's RELEASE says it arrived, so link.end() waits for both before it says goodbye.
   */
  released(): void;
  /** The message did not go out: the sequence number goes back for the next one. */
  abandoned(): void;
}

/**
 * A handler's encoding of one NCCL transfer `out`: once the message went out, `start` queues the
 * NCCL work in its turn; the hold (`bytes` for accounting) calls `letGo` once the peer released
 * the value and NCCL is done reading the memory (sent, or aborted with the link).
 */
export function ncclEncoding(out: OutgoingTransfer, data: Uint8Array, bytes: number, letGo: () => void,
  start: (comm: NcclCommunicator) => Promise<Queued>): TransferEncoding {
  let committed = false;
  let sent: Promise<void> = Promise.resolve();
  return {
    data,
    hold: {
      bytes,
      release: () => {
        out.released();
        if (!committed) out.abandoned();
        void sent.finally(letGo);
      },
    },
    onCommit: () => {
      committed = true;
      sent = out.committed(start);
    },
  };
}

/** A Fanout sending one message to several links (fanout.ts): the communicator and rank per link. */
export interface FanoutContext {
  /** The broadcast communicator for `device` (made on first use, spanning every link of the fanout). */
  commFor(device: Device): LinkComm;
  /** The receiver's rank on `link`. */
  rankOf(link: Link): number;
  /** Queues `sequence`'s work on `comm` once, after the message went to every link; the same promise for each link. */
  shared(comm: LinkComm, sequence: number, start: (comm: NcclCommunicator) => Promise<Queued>): Promise<void>;
}

let activeFanout: FanoutContext | undefined;

/** @internal Runs `fn` (a link.send) as part of `fanout`. */
export function withFanout<T>(fanout: FanoutContext, fn: () => T): T {
  const outer = activeFanout;
  activeFanout = fanout;
  try {
    return fn();
  } finally {
    activeFanout = outer;
  }
}

/** Queues `start` in `sequence`'s turn on `comm`; resolves once its work is done or failed (never rejects). */
export function queueInTurn(comm: LinkComm, sequence: number, start: (comm: NcclCommunicator) => Promise<Queued>): Promise<void> {
  return new Promise<void>((resolve) => {
    comm.submit(sequence, async (c) => {
      const q = await start(c);
      q.done.then(resolve, () => resolve());
      return q;
    }, () => resolve());
  });
}

/**
 * `sent` (a transfer's settling, which never rejects), counted among `link`'s transfers in flight
 * until it settled and `released` resolved (the peer's RELEASE, or the link's close).
 */
function tracked(link: Link, sent: Promise<void>, released: Promise<void>): Promise<void> {
  const sending = stateOf(link).sending;
  const both = Promise.all([sent, released]).then(() => {});
  sending.add(both);
  void both.finally(() => sending.delete(both));
  return sent;
}

/** A promise and the function that resolves it. */
function releaseSignal(): { released: Promise<void>; release: () => void } {
  let release!: () => void;
  const released = new Promise<void>((r) => { release = r; });
  return { released, release };
}

/** The next transfer `link` sends of `device`'s memory: on the link's own communicator, or a fanout's. */
export function beginOutgoing(link: Link, device: Device): OutgoingTransfer {
  checkNcclInClear(link, 'send');
  const fan = activeFanout;
  const { released, release } = releaseSignal();
  if (fan) {
    const comm = fan.commFor(device);
    const sequence = comm.sequence++;
    return {
      comm, sequence, reference: commReference(link, comm, fan.rankOf(link)),
      committed: (start) => {
        committedOn(link, comm);
        return tracked(link, fan.shared(comm, sequence, start), released);
      },
      released: release,
      abandoned: () => notSent(link, comm),  // the fanout gives up as a whole (fanout.ts)
    };
  }
  const comm = outgoingComm(link, device);
  const sequence = comm.sequence++;
  return {
    comm, sequence, reference: commReference(link, comm, 1),
    committed: (start) => {
      committedOn(link, comm);
      return tracked(link, queueInTurn(comm, sequence, start), released);
    },
    released: release,
    abandoned: () => {
      comm.sequence = Math.min(comm.sequence, sequence);
      notSent(link, comm);
    },
  };
}
