// Which GPU memory received over a link is mapped for. A link may name its own working device
// (a process that talks to children on different GPUs); otherwise the thread's working device
// applies (setWorkingDevice, or spawn's `device` option in a child), and without one, imported
// memory is used on the device it lives on.
import { Device, workingDevice } from '../../cuda/device.js';
import { IpcError } from '../../errors.js';
import type { Link } from './link.js';
import { invalidArgType } from '../../arg-errors.js';

const byLink = new WeakMap<Link, Device>();

/**
 * Maps device memory (pool buffers, legacy buffers, channel slots) received on `link` from now
 * on for `device` (a Device or its UUID), whatever this thread's working device is. undefined
 * goes back to the thread's working device.
 */
export function setLinkWorkingDevice(link: Link, device: Device | string | undefined): void {
  if (device === undefined) {
    byLink.delete(link);
    return;
  }
  const d = typeof device === 'string' ? Device.byUuid(device) : device;
  if (!(d instanceof Device)) throw invalidArgType('setLinkWorkingDevice expects a Device, a device UUID (\'GPU-…\') or undefined');
  byLink.set(link, d);
}

/** The device memory received on `link` is mapped for: the link's own, else the thread's working device (undefined: where it lives). */
export function linkWorkingDevice(link: Link): Device | undefined {
  return byLink.get(link) ?? workingDevice();
}
