// For tests only: a stand-in for libcuda in JavaScript, so that the device-memory paths above the
// driver (DeviceBuffer, streams, events, the tensors' copy_runs kernel, NCCL transfers over the fake
// libnccl) run on a machine without a GPU, as python/tests/fake_cuda.py does for Python. "Device
// memory" is host memory (a HostBuffer per allocation), so its addresses are real: the fake libnccl
// reads and writes them. Every queued operation runs at once (streams are always idle), copy_runs
// runs on the CPU from its run table, and a stream's completion is reported on the next turn of
// the event loop. One device (ordinal 0), registered as an NCCL stand-in (no context switch).
//
// Import this module before anything that imports src/cuda/driver.ts: it catches the completion
// handler driver.ts registers at load (install() fails loudly where it came too late).
import { addon } from '../../src/native/addon.js';
import { HostBuffer } from '../../src/host/host-buffer.js';

let completion: ((id: number) => void) | undefined;
const realSetCompletionHandler = addon.setCompletionHandler.bind(addon);
addon.setCompletionHandler = (handler) => {
  completion = handler;
  realSetCompletionHandler(handler);
};

type Bytes = ArrayBufferView | ArrayBuffer;

/** What the fake did, for tests to assert on. */
export interface FakeCudaState {
  /** Live allocations by base address. */
  readonly allocations: Map<bigint, HostBuffer>;
  /** copy_runs launches: [runs, chunks] each. */
  readonly launches: Array<[number, number]>;
  /** Calls by name. */
  readonly calls: Map<string, number>;
  /** memAlloc of exactly this many bytes fails (CUDA_ERROR_OUT_OF_MEMORY): a receiver that cannot take a set. */
  failAllocation?: number;
}

const state: FakeCudaState = { allocations: new Map(), launches: [], calls: new Map() };
let installed = false;

function bytesOf(b: Bytes): Uint8Array {
  return b instanceof ArrayBuffer ? new Uint8Array(b) : new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

function cudaError(call: string, what: string): Error {
  return Object.assign(new Error(`fake cuda: ${call}: ${what}`), { code: 'CUDA_ERROR_INVALID_VALUE', status: 1, call });
}

/** The `n` bytes at `ptr`, which must lie inside one allocation. */
function span(ptr: bigint, n: number, call: string): Uint8Array {
  for (const [base, hb] of state.allocations) {
    if (ptr >= base && ptr + BigInt(n) <= base + BigInt(hb.byteLength)) return hb.bytes.subarray(Number(ptr - base), Number(ptr - base) + n);
  }
  throw cudaError(call, `${n} bytes at 0x${ptr.toString(16)} are not in any allocation`);
}

let nextHandle = 0x7000n;
const functions = new Map<bigint, string>();

/** Runs copy_runs as the GPU would (kernels/tensors.cu): rows of (dst, src, bytes, first chunk), 32 bytes each. */
function copyRuns(args: Uint8Array, offsets: Uint32Array): void {
  const v = new DataView(args.buffer, args.byteOffset, args.byteLength);
  const table = v.getBigUint64(offsets[0]!, true);
  const runs = v.getUint32(offsets[1]!, true);
  const chunks = Number(v.getBigUint64(offsets[2]!, true));
  const rows = new DataView(span(table, runs * 32, 'cuLaunchKernel').slice().buffer);
  for (let r = 0; r < runs; r++) {
    const dst = rows.getBigUint64(r * 32, true);
    const src = rows.getBigUint64(r * 32 + 8, true);
    const n = Number(rows.getBigUint64(r * 32 + 16, true));
    span(dst, n, 'copy_runs').set(span(src, n, 'copy_runs').slice());
  }
  state.launches.push([runs, chunks]);
}

const fakes: Record<string, (...a: any[]) => unknown> = {
  driverGetVersion: () => 12080,
  deviceGetCount: () => 1,
  deviceGet: (ordinal: number) => {
    if (ordinal !== 0) throw cudaError('cuDeviceGet', `no device ${ordinal} (the fake has one)`);
    return 0;
  },
  deviceGetName: () => 'fake device',
  deviceGetUuid: () => Uint8Array.from({ length: 16 }, (_, i) => 0xf0 + i),
  deviceGetAttribute: (a: number) => ({ 16: 4, 41: 1, 75: 9, 76: 0 } as Record<number, number>)[a] ?? 0,
  deviceTotalMem: () => 2 ** 34,
  deviceGetPCIBusId: () => '0000:00:00.0',
  deviceCanAccessPeer: () => false,
  devicePrimaryCtxRetain: () => 0xc0den,
  devicePrimaryCtxRelease: () => undefined,
  ctxSetCurrent: () => undefined,
  ctxGetCurrent: () => 0xc0den,
  ctxSynchronize: () => undefined,
  memGetInfo: () => [2 ** 33, 2 ** 34],
  memAlloc: (bytes: number) => {
    if (bytes === state.failAllocation) {
      throw Object.assign(new Error(`fake cuda: cuMemAlloc: out of memory for ${bytes} bytes`), { code: 'CUDA_ERROR_OUT_OF_MEMORY', status: 2, call: 'cuMemAlloc' });
    }
    const hb = HostBuffer.allocate(bytes);
    state.allocations.set(hb.address, hb);
    return hb.address;
  },
  memFree: (ptr: bigint) => {
    const hb = state.allocations.get(ptr);
    if (!hb) throw cudaError('cuMemFree', `0x${ptr.toString(16)} is not an allocation`);
    state.allocations.delete(ptr);
    hb.close();
  },
  memGetAddressRange: (ptr: bigint) => {
    for (const [base, hb] of state.allocations) if (ptr >= base && ptr < base + BigInt(hb.byteLength)) return [base, hb.byteLength];
    throw cudaError('cuMemGetAddressRange', `0x${ptr.toString(16)} is not in any allocation`);
  },
  memcpyHtoD: (dst: bigint, src: Bytes) => { const s = bytesOf(src); span(dst, s.byteLength, 'cuMemcpyHtoD').set(s); },
  memcpyHtoDAsync: (dst: bigint, src: Bytes) => { const s = bytesOf(src); span(dst, s.byteLength, 'cuMemcpyHtoDAsync').set(s); },
  memcpyDtoH: (dst: Bytes, src: bigint) => { const d = bytesOf(dst); d.set(span(src, d.byteLength, 'cuMemcpyDtoH')); },
  memcpyDtoHAsync: (dst: Bytes, src: bigint) => { const d = bytesOf(dst); d.set(span(src, d.byteLength, 'cuMemcpyDtoHAsync')); },
  memcpyDtoD: (dst: bigint, src: bigint, n: number) => { span(dst, n, 'cuMemcpyDtoD').set(span(src, n, 'cuMemcpyDtoD').slice()); },
  memcpyDtoDAsync: (dst: bigint, src: bigint, n: number) => { span(dst, n, 'cuMemcpyDtoDAsync').set(span(src, n, 'cuMemcpyDtoDAsync').slice()); },
  memsetD8: (ptr: bigint, value: number, count: number) => { span(ptr, count, 'cuMemsetD8').fill(value); },
  memsetD8Async: (ptr: bigint, value: number, count: number) => { span(ptr, count, 'cuMemsetD8Async').fill(value); },
  memsetD32: (ptr: bigint, value: number, count: number) => { const s = span(ptr, count * 4, 'cuMemsetD32'); new DataView(s.buffer, s.byteOffset).setUint32(0, value, true); for (let i = 4; i < s.byteLength; i += 4) s.copyWithin(i, 0, 4); },
  memsetD32Async: (ptr: bigint, value: number, count: number) => fakes.memsetD32!(ptr, value, count),
  hasMemcpyBatch: () => false,
  streamCreate: () => nextHandle++,
  streamDestroy: () => undefined,
  streamQuery: () => true,
  streamSynchronize: () => undefined,
  streamWaitEvent: () => undefined,
  streamOnComplete: (_stream: bigint, id: number) => {
    if (!completion) throw new Error('fake cuda: driver.ts registered its completion handler before test/helpers/fake-cuda.ts was loaded; import the fake first');
    setImmediate(() => completion!(id));
  },
  eventCreate: () => nextHandle++,
  eventDestroy: () => undefined,
  eventRecord: () => undefined,
  eventQuery: () => true,
  moduleLoadData: () => nextHandle++,
  moduleUnload: () => undefined,
  moduleGetFunction: (_module: bigint, name: string) => {
    const h = nextHandle++;
    functions.set(h, name);
    return h;
  },
  launchKernel: (fn: bigint, _gx: number, _gy: number, _gz: number, _bx: number, _by: number, _bz: number, _shared: number, _stream: bigint, args: Bytes, offsets: Uint32Array) => {
    const name = functions.get(fn);
    if (name !== 'copy_runs') throw cudaError('cuLaunchKernel', `the fake runs copy_runs only, not ${String(name)}`);
    copyRuns(bytesOf(args), offsets);
  },
};

/**
 * Puts the fake in the addon's place (once per process); returns what it records. Registers
 * device 0 as an NCCL stand-in, so the addon's NCCL calls make no context current.
 */
export async function installFakeCuda(): Promise<FakeCudaState> {
  if (!installed) {
    installed = true;
    const target = addon as unknown as Record<string, unknown>;
    for (const [name, fn] of Object.entries(fakes)) {
      target[name] = (...a: unknown[]) => {
        state.calls.set(name, (state.calls.get(name) ?? 0) + 1);
        return fn(...a);
      };
    }
    const { Device } = await import('../../src/cuda/device.js');
    const { addStandInDevice } = await import('../../src/nccl/device-context.js');
    addStandInDevice(Device.get(0));
  }
  return state;
}
