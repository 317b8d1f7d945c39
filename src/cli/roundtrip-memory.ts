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

export function hostPatternMemory(buffer: HostBuffer): PatternMemory {
  const values = () => new Int32Array(buffer.bytes.buffer, buffer.bytes.byteOffset, buffer.byteLength / 4);
  return {
    async fill(a, b) {
      const v = values();
      for (let i = 0; i < v.length; i++) v[i] = a + i * b;
    },
    async mismatches(a, b) {
      const v = values();
      let bad = 0;
      for (let i = 0; i < v.length; i++) if (v[i] !== ((a + i * b) | 0)) bad++;
      return bad;
    },
    firstFive: () => Array.from(values().subarray(0, 5)),
  };
}
