// What one process maps of a channel: the control block (and its atomics), the slots, the
// doorbells and, for device slots, the control block's registration with the GPU (fences).
// Shared by the hub and the ends it opened in its own process; refcounted, so that the memory
// goes once the last of them is done with it.
import { addon } from '../native/addon.js';
import { HostBuffer } from '../host/index.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import type { IpcPool } from '../ipc/pool.js';
import { type HubLayout } from './layout.js';
import { JsWords } from './js-words.js';
import { Fences } from './fences.js';
import type { Doorbells } from './doorbells.js';
import { Ring } from './slot-ring.js';
import { CSlotRing, cRingUnavailable, warnNoCRing, type RingKind } from './c-ring.js';
import type { ChannelShape } from './options.js';

export interface BlockParts {
  layout: HubLayout;
  control: HostBuffer;
  slotsHost?: HostBuffer;
  slotsDevice?: DeviceBuffer;
  /** A pool the hub made for the slots (closed with them). */
  ownPool?: IpcPool;
  bells: Doorbells;
}

export class Block implements ChannelShape {
  readonly layout: HubLayout;
  readonly control: HostBuffer;
  readonly words: JsWords;
  readonly slots: HostBuffer | DeviceBuffer;
  readonly bells: Doorbells;
  /** Device slots: GPU-side ordering through fence words in the control block. */
  readonly fences: Fences | undefined;
  readonly topology: 'queue' | 'broadcast';
  readonly memory: 'host' | 'device';
  readonly slotCount: number;
  readonly slotBytes: number;
  readonly metaBytes: number;
  readonly device;
  readonly #ownPool: IpcPool | undefined;
  #refs = 1;

  /** Takes ownership of `parts`; closes them if it fails. */
  constructor(parts: BlockParts) {
    const closers: Array<{ close(): void } | undefined> = [parts.bells, parts.slotsHost, parts.slotsDevice, parts.ownPool, parts.control];
    let words: JsWords | undefined;
    try {
      words = new JsWords(new addon.SharedWords(parts.control.fd, parts.layout.totalBytes), parts.control.bytes);
      this.fences = parts.slotsDevice ? new Fences(parts.slotsDevice.device, words) : undefined;
    } catch (e) {
      words?.close();
      for (const c of closers) {
        try { c?.close(); } catch { /* releasing what was made */ }
      }
      throw e;
    }
    this.words = words;
    this.layout = parts.layout;
    this.control = parts.control;
    this.slots = (parts.slotsHost ?? parts.slotsDevice)!;
    this.bells = parts.bells;
    this.#ownPool = parts.ownPool;
    const l = parts.layout;
    this.topology = l.broadcast ? 'broadcast' : 'queue';
    this.memory = l.device ? 'device' : 'host';
    this.slotCount = l.slotCount;
    this.slotBytes = l.slotBytes;
    this.metaBytes = l.metaBytes;
    this.device = parts.slotsDevice?.device;
  }

  /** The ring protocol as participant `me`, on the JavaScript ring or the C ring (c-ring.ts; the
   * JavaScript one where the addon has no C ring). Close it before release(). */
  ring(me: number, kind: RingKind = 'js'): Ring {
    if (kind === 'c') {
      const why = cRingUnavailable();
      if (!why) {
        const fds = Array.from({ length: Math.min(32, this.bells.count) }, (_, k) => this.bells.fd(k));
        return new CSlotRing(this.words, this.control.bytes, this.layout, this.bells, me, this.control.fd, fds);
      }
      warnNoCRing(why);
    }
    return new Ring(this.words, this.control.bytes, this.layout, this.bells, me);
  }

  retain(): this {
    this.#refs++;
    return this;
  }

  /** Drops one reference; the last unmaps and closes everything. */
  release(): void {
    if (this.#refs <= 0 || --this.#refs > 0) return;
    try {
      this.fences?.close();  // before the mapping it registered goes away
    } catch (e) {
      process.emitWarning(`cuda-ipc channel: unregistering the control block from the GPU failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
    }
    this.slots.close();
    this.#ownPool?.close();
    this.words.close();
    this.control.close();
    this.bells.close();
  }
}
