// One to one, and the peer's side: createChannel(link, options) makes a hub here with one end in
// this process and attaches the process at the other end of the link in the other role;
// acceptChannel(link) is what that process calls (for any hub's attach).
import type { Link } from '../link/index.js';
import { waitScope, type WaitOptions } from '../abort.js';
import { ChannelHub, openOwnedEnd } from './hub.js';
import { ChannelProducer } from './producer.js';
import { ChannelConsumer } from './consumer.js';
import { accept } from './attach.js';
import type { HostBuffer } from '../host/index.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import type { Device } from '../cuda/device.js';
import type { IpcPool } from '../ipc/pool.js';
import { checkRole, checkWait, type ChannelOptions, type ChannelRole, type ChannelWaitOptions, type SlotBuffer } from './options.js';

/** Options of createChannel(): the channel's shape, how this end waits, and its role; `signal` /
 * `timeout` give up waiting for the peer's acceptChannel (AbortError / ERR_TIMEOUT). */
export type CreateChannelOptions = ChannelOptions & ChannelWaitOptions & WaitOptions & { role: ChannelRole };

/** Producer with device slots (`memory: { device }` or `{ pool }`): DeviceBuffer slots. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'producer'; memory: { pool: IpcPool } | { device: Device } }): Promise<ChannelProducer<DeviceBuffer, Meta>>;
/** Producer with host slots (`memory: 'host'` or left out): HostBuffer slots. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'producer'; memory?: 'host' }): Promise<ChannelProducer<HostBuffer, Meta>>;
/** Producer, slots of the kind `memory` says at run time. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'producer' }): Promise<ChannelProducer<SlotBuffer, Meta>>;
/** Consumer with device slots. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'consumer'; memory: { pool: IpcPool } | { device: Device } }): Promise<ChannelConsumer<DeviceBuffer, Meta>>;
/** Consumer with host slots. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'consumer'; memory?: 'host' }): Promise<ChannelConsumer<HostBuffer, Meta>>;
/** Consumer, slots of the kind `memory` says at run time. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions & { role: 'consumer' }): Promise<ChannelConsumer<SlotBuffer, Meta>>;
/** Either role, as `options.role` says at run time. */
export function createChannel<Meta = unknown>(
  link: Link, options: CreateChannelOptions): Promise<ChannelProducer<SlotBuffer, Meta> | ChannelConsumer<SlotBuffer, Meta>>;
/**
 * One to one: creates a channel with this process's end in `options.role`, and attaches the
 * process at the other end of `link` in the other role (it calls acceptChannel(link)). Closing
 * the end (or end() of a producer) closes the channel here. The slot type follows `memory`
 * (DeviceBuffer for `{ device }` / `{ pool }`, else HostBuffer); `Meta` types the messages'
 * metadata: `createChannel<{ seq: number }>(link, { role: 'producer', ... })`.
 *
 * Every failure rejects the promise; nothing is left behind (the hub and this end are closed).
 * @throws TypeError ERR_INVALID_ARG_VALUE for a `role` other than 'producer' / 'consumer', a bad
 * `wait`, `topology` or `memory` (ERR_INVALID_ARG_TYPE for a `memory` of the wrong type);
 * RangeError ERR_OUT_OF_RANGE for `slots`, `slotBytes`, `metaBytes`, `maxPeers`, `producers`,
 * `consumers` or `spinMicros` out of range.
 * @throws IpcError ERR_LINK_CLOSED when `link` is closed already; ERR_PEER_GONE when the peer
 * goes away before it accepted; ERR_PEER_REFUSED when its acceptChannel refused the channel
 * (another role or memory than it asked for); ERR_FRAME_INVALID when it answered with another
 * message; ERR_TIMEOUT after `options.timeout`, an AbortError on `options.signal`;
 * ERR_OUT_OF_MEMORY (host) or CudaError CUDA_ERROR_OUT_OF_MEMORY (device) when the slots do not
 * fit; ERR_IMPORTED_POOL for a pool another process made; ERR_FD_LIMIT when no file descriptor
 * is left.
 */
export async function createChannel(link: Link, options: CreateChannelOptions): Promise<ChannelProducer<SlotBuffer, any> | ChannelConsumer<SlotBuffer, any>> {
  const role = checkRole(options?.role, 'createChannel');
  checkWait(options);
  const hub = ChannelHub.create(options);
  let end: ChannelProducer | ChannelConsumer | undefined;
  try {
    end = openOwnedEnd(hub, role, { wait: options.wait, spinMicros: options.spinMicros });
    await hub.attach(link, { role: role === 'producer' ? 'consumer' : 'producer', signal: options.signal, timeout: options.timeout });
    return end;
  } catch (e) {
    end?.close();
    hub.close();
    throw e;
  }
}

/** Options of acceptChannel(): what to accept (role, memory) and how the end waits; `signal` /
 * `timeout` give up waiting for the hub (AbortError / ERR_TIMEOUT). */
export interface AcceptOptions extends ChannelWaitOptions, WaitOptions {
  /** Refuse the channel unless the hub attached this process in this role (and type the end). */
  role?: ChannelRole;
  /** Refuse the channel unless its slots are this kind of memory; the returned end's slots are
   * then typed as HostBuffer ('host') or DeviceBuffer ('device'). */
  memory?: 'host' | 'device';
}

/** Producer with host slots (refuses others). */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'producer'; memory: 'host' }): Promise<ChannelProducer<HostBuffer, Meta>>;
/** Producer with device slots (refuses others). */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'producer'; memory: 'device' }): Promise<ChannelProducer<DeviceBuffer, Meta>>;
/** Producer, slots of either kind. */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'producer' }): Promise<ChannelProducer<SlotBuffer, Meta>>;
/** Consumer with host slots (refuses others). */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'consumer'; memory: 'host' }): Promise<ChannelConsumer<HostBuffer, Meta>>;
/** Consumer with device slots (refuses others). */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'consumer'; memory: 'device' }): Promise<ChannelConsumer<DeviceBuffer, Meta>>;
/** Consumer, slots of either kind. */
export function acceptChannel<Meta = unknown>(link: Link, options: AcceptOptions & { role: 'consumer' }): Promise<ChannelConsumer<SlotBuffer, Meta>>;
/** Either role, as the hub gave it. */
export function acceptChannel<Meta = unknown>(link: Link, options?: AcceptOptions): Promise<ChannelProducer<SlotBuffer, Meta> | ChannelConsumer<SlotBuffer, Meta>>;
/**
 * The peer's side of attach()/createChannel(): receives the channel over `link`, checks it, and
 * returns this process's end in the role the hub gave it (refused unless it is `options.role`,
 * when given). `memory: 'host'` / `'device'` refuses other slots and types them (HostBuffer /
 * DeviceBuffer); `Meta` types the messages' metadata:
 * `acceptChannel<{ seq: number }>(link, { role: 'consumer', memory: 'host' })`.
 *
 * Every failure rejects the promise, and the hub learns why (its attach rejects too).
 * @throws TypeError ERR_INVALID_ARG_VALUE for a bad `role` or `wait`; RangeError ERR_OUT_OF_RANGE
 * for `spinMicros` out of range.
 * @throws IpcError ERR_DESCRIPTOR_KIND when the hub attached this process in another role or with
 * other memory than asked; ERR_DESCRIPTOR_INVALID / ERR_DESCRIPTOR_VERSION for a control block
 * that does not check out; ERR_FRAME_INVALID when the first message on the link is not a channel;
 * ERR_LINK_CLOSED / ERR_PEER_GONE when the link closes first; ERR_TIMEOUT after
 * `options.timeout`, an AbortError on `options.signal`; ERR_FD_LIMIT when no fd is left.
 */
export async function acceptChannel<B extends SlotBuffer = SlotBuffer>(link: Link, options: AcceptOptions = {}): Promise<ChannelProducer<B, any> | ChannelConsumer<B, any>> {
  const policy = checkWait(options);
  if (options.role !== undefined) checkRole(options.role, 'acceptChannel');
  const scope = waitScope(options, 'acceptChannel');
  let accepted;
  try {
    accepted = await accept(link, { role: options.role, memory: options.memory, signal: scope.signal });
  } catch (e) {
    throw scope.translate(e);
  } finally {
    scope.done();
  }
  const { block, index, role } = accepted;
  const init = { block, index, role, policy, hubLink: link };
  try {
    return role === 'producer' ? new ChannelProducer<B>(init) : new ChannelConsumer<B>(init);
  } catch (e) {
    block.release();  // the hub repairs the entry once the link closes
    throw e;
  }
}
