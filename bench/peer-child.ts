// Child of the peer benchmark, spawned with { device } (the GPU it works on). Receives a pool
// buffer that lives on another GPU and times, on its own GPU, in alternating rounds:
//   - the checksum kernel reading the shared buffer (over the peer link),
//   - the same kernel reading a buffer of its own GPU of the same size,
//   - a copy of the shared buffer into its own GPU's memory (cuMemcpyDtoDAsync).
// Each sample is the mean of `batch` back-to-back operations; replies { kernelPeerUs, kernelLocalUs, copyUs }.
import { parentLink } from '../src/link/index.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { Stream } from '../src/cuda/stream.js';
import { BuiltinKernels } from '../src/cuda/builtins.js';
import { arg } from '../src/cuda/kernel-args.js';

const link = parentLink();
const { buffer: shared, reps, batch } = (await link.receive()) as { buffer: DeviceBuffer; reps: number; batch: number };
const say = (what: string) => process.stderr.write(`  [peer child] ${what}\n`);
const device = shared.device;
say(`mapped ${shared.byteLength} bytes of ${shared.residentDevice.name} (${shared.residentDevice.uuid}) for ${device.name} (${device.uuid})`);
const stream = Stream.create(device);
const local = DeviceBuffer.allocate(shared.byteLength, { device });
const copy = DeviceBuffer.allocate(shared.byteLength, { device });
const sums = DeviceBuffer.allocate(16, { device });
local.copyFrom(shared, { stream });
const kernel = BuiltinKernels.for(device).kernel('checksum_bytes');
const grid = Math.max(1, Math.min(Math.ceil(shared.byteLength / 16 / 256), device.multiprocessors * 16));

async function time(op: () => void): Promise<number[]> {
  const samples: number[] = [];
  for (let r = 0; r < reps; r++) {
    await stream.synchronize();
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < batch; i++) op();
    await stream.synchronize();
    samples.push(Number(process.hrtime.bigint() - t0) / 1000 / batch);
  }
  return samples;
}
const readKernel = (buf: DeviceBuffer) => () => kernel.launch({ grid, block: 256, stream }, [arg.ptr(buf), arg.u64(BigInt(buf.byteLength)), arg.ptr(sums)]);
const copyShared = () => copy.copyFrom(shared, { stream });

// Warm up every path once, then alternate so that clock changes hit all alike.
await time(readKernel(shared));
await time(readKernel(local));
await time(copyShared);
say('warmed up');
const kernelPeerUs: number[] = [];
const kernelLocalUs: number[] = [];
const copyUs: number[] = [];
for (let round = 0; round < 3; round++) {
  kernelPeerUs.push(...await time(readKernel(shared)));
  kernelLocalUs.push(...await time(readKernel(local)));
  copyUs.push(...await time(copyShared));
}
await stream.synchronize();
for (const b of [local, copy, sums, shared]) b.close();
stream.close();
link.send({ kernelPeerUs, kernelLocalUs, copyUs });
await link.end();
