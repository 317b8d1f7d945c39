// Interprocess events as descriptors: export an event created with { interprocess: true } and
// open it in another process, where stream.waitEvent and synchronize() work on it.
import { driver } from '../cuda/driver.js';
import { Device } from '../cuda/device.js';
import { Event } from '../cuda/event.js';
import { CudaError, IpcError } from '../errors.js';
import { ipcEventDescriptor, parseDescriptorJson, decodeDescriptor, validateDescriptor, type IpcEventDescriptor } from './descriptor.js';

declare module '../cuda/event.js' {
  interface Event {
    /** A descriptor another process opens with openIpcEvent (the event must be interprocess). */
    ipcHandle(): IpcEventDescriptor;
  }
}

const handles = new WeakMap<Event, Uint8Array>();

Event.prototype.ipcHandle = function ipcHandle(this: Event): IpcEventDescriptor {
  if (!this.interprocess) {
    throw new IpcError('ERR_NOT_EXPORTABLE', 'this event was not created as interprocess; create it with Event.create(device, { interprocess: true })');
  }
  let h = handles.get(this);
  if (!h) {
    this.device.activate();
    h = driver.ipcGetEventHandle(this.handle);
    handles.set(this, h);
  }
  return ipcEventDescriptor({ handle: h, deviceUuid: this.device.uuid, pid: process.pid });
};

/** Opens another process's interprocess event (descriptor object, JSON text or binary form). */
export function openIpcEvent(input: IpcEventDescriptor | string | Uint8Array): Event {
  const desc = typeof input === 'string' ? parseDescriptorJson(input, 'cuda-ipc-event')
    : input instanceof Uint8Array ? decodeDescriptor(input, 'cuda-ipc-event')
    : validateDescriptor(input, 'cuda-ipc-event');
  const device = Device.byUuid(desc.deviceUuid);
  device.activate();
  let handle: bigint;
  try {
    handle = driver.ipcOpenEventHandle(desc.handle);
  } catch (e) {
    if (e instanceof CudaError && (e.code === 'CUDA_ERROR_INVALID_VALUE' || e.code === 'CUDA_ERROR_INVALID_CONTEXT')) {
      throw new IpcError('ERR_HANDLE_STALE',
        desc.pid === process.pid ? 'an interprocess event cannot be opened in the process that created it; use the Event itself'
          : `the event handle could not be opened: process ${desc.pid} destroyed the event or exited`, { cause: e });
    }
    throw e;
  }
  return new Event(device, handle, true, true);
}
