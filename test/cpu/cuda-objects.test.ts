// CUDA objects fail clearly where there is no driver (CI), instead of crashing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { probeDriver } from '../../src/cuda/driver.js';
import { Stream } from '../../src/cuda/stream.js';
import { Event } from '../../src/cuda/event.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Module, compileCuda } from '../../src/cuda/module.js';
import { CudaError } from '../../src/errors.js';

const noDriver = probeDriver().ok ? 'a CUDA driver is present here' : undefined;
const missingDriver = (e: unknown) => e instanceof CudaError && e.code === 'CUDA_DRIVER_NOT_FOUND' && /libcuda\.so\.1/.test(e.message);

test('streams, events, buffers and modules throw CUDA_DRIVER_NOT_FOUND without a driver', { skip: noDriver }, () => {
  assert.throws(() => Stream.create(), missingDriver);
  assert.throws(() => Event.create(), missingDriver);
  assert.throws(() => Event.create(undefined, { interprocess: true }), missingDriver);
  assert.throws(() => DeviceBuffer.allocate(1024), missingDriver);
  assert.throws(() => Module.load('// ptx'), missingDriver);
  assert.throws(() => compileCuda('__global__ void k() {}'), (e: unknown) => e instanceof Error && /NVRTC|libcuda/.test(e.message));
});
