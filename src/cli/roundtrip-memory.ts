// The memory a round trip runs on: a pool buffer on the GPU, or host shared memory where CUDA
// IPC is not available. Both fill a + i*b int32 values, verify them, and show the first five.
import { DeviceBuffer } from '../cuda/buffer.js';
import { Stream } from '../cuda/stream.js';
import { BuiltinKernels } from '../cuda/builtins.js';
import { HostBuffer } from '../host/host-buffer.js';

export interface PatternMemory {
  fill(a: number, b: number): Promise<void>;
  /** Number of elements that differ from a + i*b. */
  mismatches(a: number, b: number): Promise<number>;
  firstFive(): number[];
}

export function devicePatternMemory(buffer: DeviceBuffer, stream: Stream): PatternMemory {
  const kernels = BuiltinKernels.for(buffer.device);
  return {
    async fill(a, b) {
      kernels.fillPattern(buffer, 'i32', a, b, stream);
      await stream.synchronize();
    },
    async mismatches(a, b) {
      return Number((await kernels.verifyPattern(buffer, 'i32', a, b, stream)).mismatches);
    },
    firstFive() {
      const out = new Int32Array(Math.min(5, buffer.byteLength / 4));
      buffer.read(out);
      return Array.from(out);
    },
  };
}

/** Host memory is filled and checked this many int32 at a time (a buffer larger than one typed
 * array can be, 4 GiB on Node 20, has no single view). */
const HOST_PIECE_ELEMENTS = 2 ** 26;

export function hostPatternMemory(buffer: HostBuffer): PatternMemory {
  const elements = Math.floor(buffer.byteLength / 4);
  /** Calls fn(values, firstIndex) for each piece of the buffer, as int32 over a view of it. */
  const pieces = (fn: (values: Int32Array, first: number) => void): void => {
    for (let first = 0; first < elements; first += HOST_PIECE_ELEMENTS) {
      const count = Math.min(HOST_PIECE_ELEMENTS, elements - first);
      using piece = buffer.view(first * 4, count * 4);
      fn(new Int32Array(piece.bytes.buffer, piece.bytes.byteOffset, count), first);
    }
  };
  return {
    async fill(a, b) {
      pieces((v, first) => {
        for (let i = 0; i < v.length; i++) v[i] = a + (first + i) * b;
      });
    },
    async mismatches(a, b) {
      let bad = 0;
      pieces((v, first) => {
        for (let i = 0; i < v.length; i++) if (v[i] !== ((a + (first + i) * b) | 0)) bad++;
      });
      return bad;
    },
    firstFive: () => Array.from(buffer.read(new Int32Array(Math.min(5, elements)), 0)),
  };
}
