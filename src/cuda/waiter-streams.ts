// Idle streams for CPU-side waits (events, fence words): a stream that waits is busy until its
// condition holds, so each concurrent wait takes its own and hands it back afterwards.
import type { Device } from './device.js';
import { Stream } from './stream.js';

const idle = new Map<Device, Stream[]>();

export function takeWaiterStream(device: Device): Stream {
  return idle.get(device)?.pop() ?? Stream.create(device);
}

export function returnWaiterStream(stream: Stream): void {
  let list = idle.get(stream.device);
  if (!list) idle.set(stream.device, (list = []));
  if (list.length < 8) list.push(stream);
  else stream.close();
}
