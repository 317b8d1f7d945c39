// For tests only (not in the package): what the public channel classes keep
// to themselves.
import { IpcError } from '../../src/errors.js';
import { endpointOf, blockOf } from '../../src/channel/internal.js';
import type { WaitStats } from '../../src/channel/waiter.js';
import type { Endpoint } from '../../src/channel/endpoint.js';
import { CSlotRing, type RingKind } from '../../src/channel/c-ring.js';
import { invalidArgValue } from '../../src/arg-errors.js';

function endpoint(end: object): Endpoint {
  const e = endpointOf.get(end);
  if (!e) throw invalidArgValue('not a channel end');
  return e;
}

/** The control block's bytes, shared with every participant (of an end or a hub). */
export function controlBytesOf(endOrHub: object): Uint8Array {
  const block = endpointOf.get(endOrHub)?.block ?? blockOf.get(endOrHub);
  if (!block) throw invalidArgValue('not a channel end or hub');
  return block.control.bytes;
}

/** How an end's waits ended so far (spin hits, sleeps, doorbell wake-ups, backstop rescues). */
export function waitStatsOf(end: object): WaitStats {
  return { ...endpoint(end).waiter.stats };
}

/** Which ring serves an end: 'c' (the C ring, CUDA_IPC_CHANNEL_RING=c) or 'js'. */
export function ringKindOf(end: object): RingKind {
  return endpoint(end).ring instanceof CSlotRing ? 'c' : 'js';
}
