// What the hub and the ends of a channel in this process have in common. ChannelPart: the
// channel's shape (ChannelShape), copied once from the Block they share. ChannelEnd: a producer or
// consumer end, with its participant index and what its Endpoint tells of it.
import type { Device } from '../cuda/device.js';
import type { Block } from './block.js';
import type { Endpoint } from './endpoint.js';
import { endpointOf } from './internal.js';
import type { ChannelShape, ChannelStats, ChannelTopology, WaitPolicy } from './options.js';

export abstract class ChannelPart implements ChannelShape {
  // ChannelShape's fields again: a class declares the fields of the interface it implements.
  readonly topology: ChannelTopology;
  readonly memory: 'host' | 'device';
  readonly slotCount: number;
  readonly slotBytes: number;
  readonly metaBytes: number;
  readonly device: Device | undefined;

  protected constructor(block: Block) {
    this.topology = block.topology;
    this.memory = block.memory;
    this.slotCount = block.slotCount;
    this.slotBytes = block.slotBytes;
    this.metaBytes = block.metaBytes;
    this.device = block.device;
  }
}

export abstract class ChannelEnd extends ChannelPart {
  /** This end's participant index in the control block (the hub is 0). */
  readonly index: number;
  readonly #end: Endpoint;

  protected constructor(end: Endpoint) {
    super(end.block);
    this.#end = end;
    this.index = end.index;
    endpointOf.set(this, end);
  }

  get closed(): boolean {
    return this.#end.closed;
  }

  /** How this end waits (options.wait, spinMicros). */
  get waitPolicy(): WaitPolicy {
    return this.#end.waiter.policy;
  }

  /** Slot states and membership, read from the control block now. */
  stats(): ChannelStats {
    this.#end.assertOpen('stats');
    return this.#end.stats();
  }
}
