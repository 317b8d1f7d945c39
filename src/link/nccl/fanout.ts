// One message to several TCP links at once, its device memory moved once: an NCCL broadcast from
// this process (rank 0) to every receiver (ranks 1..N) over one communicator, instead of one send
// per link. How checkpoint-engine and vLLM sync many inference engines: the trainer's bytes leave
// once, NCCL's broadcast pipelines them down a chain or tree. Receivers need nothing special: they
// receive as from a single sender (the record says it is a broadcast and gives their rank).
import type { Device } from '../../cuda/device.js';
import { IpcError } from '../../errors.js';
import { invalidArgType, invalidArgValue } from '../../arg-errors.js';
import type { NcclCommunicator } from '../../nccl/communicator.js';
import type { Link } from '../connection/link.js';
import { addBroadcastComm, newRootComm, queueInTurn, withFanout, type FanoutContext, type LinkComm, type Queued } from './nccl-comms.js';

/**
 * Sends each message to every link of the fanout; DeviceBuffers, DeviceArrays and TensorMaps in it
 * are broadcast over one NCCL communicator spanning all of them (made at the first send, its
 * unique id in the first record on each link). Every link must be a TCP link to a different
 * process on its own GPU. A link that closes ends the broadcast communicator for all: later sends
 * of device memory through this fanout fail (ERR_NCCL); make a new Fanout over the links still open.
 */
export class Fanout {
  readonly links: readonly Link[];
  readonly #comms = new Map<Device, LinkComm>();
  /** Work queued per sequence number by the current send (once for all links). */
  #pending = new Map<string, { start: (comm: NcclCommunicator) => Promise<Queued>; comm: LinkComm; sequence: number; settled: Promise<void>; settle: () => void }>();
  #closed = false;

  constructor(links: Iterable<Link>) {
    const list = [...links];
    if (list.length === 0) throw invalidArgValue('a Fanout needs at least one link');
    const seen = new Set<Link>();
    for (const l of list) {
      if (typeof l !== 'object' || l === null || typeof (l as Link).send !== 'function') throw invalidArgType('a Fanout takes Links (from connect() or listen())');
      if (seen.has(l)) throw invalidArgValue(`link #${l.id} is in the Fanout twice`);
      seen.add(l);
      if (l.transport !== 'tcp') throw invalidArgValue(`link #${l.id} is a ${l.transport} link; a Fanout broadcasts over NCCL to TCP links (on one machine, send to each link: memory is shared there)`);
    }
    this.links = list;
  }

  /**
   * Sends `value` on every link; its device memory is broadcast once. Returns false when some
   * link's peer is behind (see Link.send; wait for its 'drain'). All or nothing: when a link
   * refuses the message (closed, a bound reached), the broadcast communicator is aborted (the
   * receivers that got the message fail it with ERR_NCCL) and the error is thrown.
   */
  send(value: unknown): boolean {
    if (this.#closed) throw new IpcError('ERR_CLOSED', 'this Fanout is closed');
    const before = new Map([...this.#comms.values()].map((c) => [c, c.sequence]));
    const context: FanoutContext = {
      commFor: (device) => this.#commFor(device),
      rankOf: (link) => this.links.indexOf(link) + 1,
      shared: (comm, sequence, start) => this.#share(comm, sequence, start),
    };
    let all = true;
    try {
      for (const link of this.links) {
        // Every link numbers the same transfers the same: each send starts from the same place.
        for (const [comm, sequence] of before) comm.sequence = sequence;
        for (const comm of this.#comms.values()) if (!before.has(comm)) comm.sequence = 0;
        all = withFanout(context, () => link.send(value)) && all;
      }
    } catch (e) {
      for (const p of this.#pending.values()) p.settle();
      this.#pending.clear();
      for (const comm of this.#comms.values()) {
        comm.abort(new IpcError('ERR_NCCL', `a Fanout send failed on one of its links (${(e as Error).message}); its broadcast was abandoned`), 1);
      }
      this.#comms.clear();
      throw e;
    }
    // Every link took it: queue each transfer once.
    for (const p of this.#pending.values()) void queueInTurn(p.comm, p.sequence, p.start).finally(p.settle);
    this.#pending.clear();
    return all;
  }

  #commFor(device: Device): LinkComm {
    let comm = this.#comms.get(device);
    if (comm && !comm.ended) return comm;
    comm = newRootComm(device, this.links.length + 1, true);
    for (const link of this.links) addBroadcastComm(link, comm);
    this.#comms.set(device, comm);
    return comm;
  }

  #share(comm: LinkComm, sequence: number, start: (comm: NcclCommunicator) => Promise<Queued>): Promise<void> {
    const key = `${comm.key}:${sequence}`;
    let p = this.#pending.get(key);
    if (!p) {
      let settle!: () => void;
      const settled = new Promise<void>((resolve) => { settle = resolve; });
      p = { start, comm, sequence, settled, settle };
      this.#pending.set(key, p);
    }
    return p.settled;
  }

  /** Ends the fanout: its broadcast communicators are aborted (the links stay open). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const comm of this.#comms.values()) comm.abort(new IpcError('ERR_CLOSED', 'the Fanout was closed'));
    this.#comms.clear();
  }

  /** Same as close(). */
  [Symbol.dispose](): void {
    this.close();
  }
}
