// The CUDA part of the addon, ready to call: failed calls throw CudaError, and stream completions
// resolve promises. Constants mirror native/cuda_abi.h.
import { addon } from '../native/addon.js';
import { CudaError } from '../errors.js';

addon.setErrorClass(CudaError);

export const driver = addon;

export const Attr = {
  MULTIPROCESSOR_COUNT: 16,
  INTEGRATED: 18,
  PCI_BUS_ID: 33,
  PCI_DEVICE_ID: 34,
  UNIFIED_ADDRESSING: 41,
  PCI_DOMAIN_ID: 50,
  COMPUTE_CAPABILITY_MAJOR: 75,
  COMPUTE_CAPABILITY_MINOR: 76,
  MANAGED_MEMORY: 83,
  VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 102,
  HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: 103,
  MEMORY_POOLS_SUPPORTED: 115,
  MEMPOOL_SUPPORTED_HANDLE_TYPES: 119,
  CAN_USE_64_BIT_STREAM_MEM_OPS: 122,
  CAN_USE_STREAM_WAIT_VALUE_NOR: 123,
  IPC_EVENT_SUPPORTED: 125,
  HANDLE_TYPE_FABRIC_SUPPORTED: 128,
} as const;

export const PointerAttr = {
  MEMORY_TYPE: 2,
  IS_MANAGED: 8,
  DEVICE_ORDINAL: 9,
  RANGE_START_ADDR: 11,
  RANGE_SIZE: 12,
  MAPPED: 13,
  MEMPOOL_HANDLE: 17,
} as const;

/** CUdevice_P2PAttribute. */
export const P2PAttr = {
  PERFORMANCE_RANK: 1,
  ACCESS_SUPPORTED: 2,
  NATIVE_ATOMIC_SUPPORTED: 3,
} as const;

export const MemoryType = { HOST: 1, DEVICE: 2, ARRAY: 3, UNIFIED: 4 } as const;

export const HandleType = { NONE: 0, POSIX_FD: 1, FABRIC: 8 } as const;

export const Flags = {
  STREAM_NON_BLOCKING: 1,
  EVENT_DISABLE_TIMING: 2,
  EVENT_INTERPROCESS: 4,
  ACCESS_READWRITE: 3,
  WAIT_VALUE_GEQ: 0,
  WAIT_VALUE_EQ: 1,
  WAIT_VALUE_AND: 2,
  WAIT_VALUE_NOR: 3,
  HOST_REGISTER_PORTABLE: 1,
  HOST_REGISTER_DEVICEMAP: 2,
} as const;

// Stream completions: the native side calls back with an id once the stream passes a point.
let nextCompletionId = 1;
const pendingCompletions = new Map<number, { resolve: () => void; keep: unknown }>();
addon.setCompletionHandler((id) => {
  const p = pendingCompletions.get(id);
  if (p) {
    pendingCompletions.delete(id);
    p.resolve();
  }
});

/**
 * Resolves once all work queued on `stream` so far has finished, without blocking any thread.
 * `keep` is held until then: host memory that an asynchronous copy still reads or writes.
 */
export function whenStreamDone(stream: bigint, keep?: unknown): Promise<void> {
  return new Promise<void>((resolve) => {
    const id = nextCompletionId++;
    pendingCompletions.set(id, { resolve, keep });
    try {
      driver.streamOnComplete(stream, id);
    } catch (e) {
      pendingCompletions.delete(id);
      throw e;
    }
  });
}

/** Whether the driver can be used here, with the reason when not (never throws). */
export function probeDriver(): { ok: true; version: number } | { ok: false; error: CudaError | Error } {
  try {
    return { ok: true, version: driver.driverGetVersion() };
  } catch (e) {
    return { ok: false, error: e as Error };
  }
}
