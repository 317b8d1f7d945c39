// The options and shared types of the channel API, and their checks.
import { IpcError } from '../errors.js';
import type { WaitOptions } from '../abort.js';
import type { HostBuffer } from '../host/index.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import type { Device } from '../cuda/device.js';
import type { Stream } from '../cuda/stream.js';
import type { IpcPool } from '../ipc/pool.js';
import { DEFAULT_ADAPTIVE_SPIN_MICROS, DEFAULT_SPIN_MICROS, MAX_SPIN_MICROS, type WaitMode, type WaitPolicy } from './waiter.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

/** Which end: a producer publishes messages, a consumer receives them. */
export type ChannelRole = 'producer' | 'consumer';
/** 'queue': each message goes to one consumer (work sharing; also one to one and many to one).
 * 'broadcast': each message goes to every consumer; its slot is freed once all released it. */
export type ChannelTopology = 'queue' | 'broadcast';
/** Where the slots live: host shared memory (memfd), or device memory from an IPC pool (yours,
 * or a new one on `device`). */
export type ChannelMemory = 'host' | { pool: IpcPool } | { device: Device };
/** What a slot is: shared host memory or device memory. */
export type SlotBuffer = HostBuffer | DeviceBuffer;
/** publish()'s options argument: required, with `meta`, when the channel's `Meta` type does not
 * include undefined (so that every message carries what consumers are typed to read); type the
 * channel `Meta | undefined` for messages that carry meta only sometimes. */
export type PublishArgs<Meta> = undefined extends Meta ? [options?: PublishOptions<Meta>] : [options: PublishOptions<Meta> & { meta: Meta }];
/** The slot type a `memory` option gives. */
export type SlotBufferFor<M> = [M] extends ['host'] ? HostBuffer : [M] extends [undefined] ? HostBuffer : [M] extends [{ pool: IpcPool } | { device: Device }] ? DeviceBuffer : SlotBuffer;
export type { WaitMode, WaitPolicy };

/**
 * How an end waits; accepted wherever an end is made (createChannel, acceptChannel,
 * hub.producer(), ...).
 */
export interface ChannelWaitOptions {
  /**
   * How an end waits when it has to (no message yet, every slot in flight). It sleeps on an
   * eventfd that the event loop polls, woken by the peer that changed what it waits for; before
   * that it may spin on the event loop's thread (blocking it meanwhile):
   * 'adaptive' (default): spins for about twice the length of recent waits, at most
   * `spinMicros` (default 10 us), and not at all while waits are long: low latency when a peer
   * answers within microseconds, no CPU burnt while idle.
   * 'sleep': never spins (the least CPU, a wake-up costs one event-loop hop).
   * 'spin': always spins for `spinMicros` (default 50 us) first: the lowest latency, at the cost
   * of a busy core.
   */
  wait?: WaitMode;
  /** The spin bound of 'adaptive' or the spin of 'spin', in microseconds (0..100000). */
  spinMicros?: number;
}

/** The shape of a channel, fixed when it is created (ChannelHub.create, createChannel, pipeline). */
export interface ChannelOptions {
  /** Number of slots: messages in flight at once (backpressure beyond that). */
  slots: number;
  /** Bytes per slot. For device memory, a multiple of 256 keeps every slot aligned for kernels. */
  slotBytes: number;
  memory?: ChannelMemory;
  topology?: ChannelTopology;
  /** Bytes of metadata per message (`publish(slot, { meta })`); default 256, a multiple of 8. */
  metaBytes?: number;
  /** Ends this channel can have at once, in this process or attached (default 15, at most 31). */
  maxPeers?: number;
  /** Consumers end once this many producers have attached and all have left (default 1). */
  producers?: number;
  /** Producers fail once this many consumers have attached and all have left (default 1); a
   * broadcast producer waits until this many are attached before its first acquire returns. */
  consumers?: number;
}

/** Gives up a wait: `signal` (AbortError, code ABORT_ERR), `timeout` in ms (ERR_TIMEOUT). */
export type { WaitOptions };

/** Options of `producer.acquire()`. */
export interface AcquireOptions extends WaitOptions {
  /** Device slots: GPU work queued on this stream after acquire waits for the consumers' GPU
   * work on the slot's previous message (no CPU wait). Without it, acquire waits on the CPU. */
  stream?: Stream;
}

/** Options of `producer.publish(slot, options)`; `Meta` is the channel's metadata type. */
export interface PublishOptions<Meta = unknown> {
  /** Device slots: the stream your GPU work on the slot ran on; consumers' GPU work waits for
   * it (default: the legacy stream). */
  stream?: Stream;
  /** JSON-serialisable metadata, or a Uint8Array (at most the channel's metaBytes once encoded).
   * Required when the channel's `Meta` type does not include undefined. */
  meta?: Meta;
  /** Bytes of the slot the message uses (default: the whole slot). */
  length?: number;
}

/** Options of `message.release()`. */
export interface ReleaseOptions {
  /** Device slots: the stream that ran the consumer's GPU work on the message (default: the
   * legacy stream); the producer's next use of the slot waits for that work. */
  stream?: Stream;
}

/** Options of `consumer.receive()`: `signal` aborts the wait (AbortError), `timeout` ends it (ERR_TIMEOUT). */
export type ReceiveOptions = WaitOptions;

/** A snapshot of a channel's slots and members, from `stats()` on a hub or an end. */
export interface ChannelStats {
  slots: { free: number; writing: number; published: number; taken: number };
  producers: { attached: number; live: number; died: number };
  consumers: { attached: number; live: number; died: number };
  /** Positions published so far. */
  published: number;
}

/** What every end and the hub tell about the channel. */
export interface ChannelShape {
  readonly topology: ChannelTopology;
  readonly memory: 'host' | 'device';
  readonly slotCount: number;
  readonly slotBytes: number;
  readonly metaBytes: number;
  /** The device of device slots. */
  readonly device: Device | undefined;
}

export function checkWait(o: ChannelWaitOptions | undefined): WaitPolicy {
  const mode = o?.wait ?? 'adaptive';
  if (mode !== 'adaptive' && mode !== 'sleep' && mode !== 'spin') {
    const renamed = (mode as string) === 'futex' ? " ('futex' is now 'sleep', or 'adaptive', the default)" : '';
    throw invalidArgValue(`wait must be 'adaptive', 'sleep' or 'spin'; got ${String(mode)}${renamed}`);
  }
  const spinMicros = o?.spinMicros ?? (mode === 'spin' ? DEFAULT_SPIN_MICROS : DEFAULT_ADAPTIVE_SPIN_MICROS);
  if (typeof spinMicros !== 'number' || !Number.isFinite(spinMicros) || spinMicros < 0 || spinMicros > MAX_SPIN_MICROS) {
    throw badNumber(spinMicros, `spinMicros must be in 0..${MAX_SPIN_MICROS}; got ${String(spinMicros)}`);
  }
  return { mode, spinMicros };
}

export function checkRole(role: unknown, what: string): ChannelRole {
  if (role !== 'producer' && role !== 'consumer') throw invalidArgValue(`${what}: role must be 'producer' or 'consumer'; got ${String(role)}`);
  return role;
}

export function closedError(what: string): IpcError {
  return new IpcError('ERR_CHANNEL_CLOSED', `${what}: the channel is closed`);
}

export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
