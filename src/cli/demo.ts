// `cuda-ipc demo events|transform`: the examples of the CUDA IPC tutorial this project grew from.
//  events:    the parent launches a slow kernel and records an IPC event; the child waits on the
//             imported event and reports how long it waited.
//  transform: the parent writes 100 + i with a kernel; a child doubles the values in place with a
//             kernel on the shared memory; the parent verifies 200 + 2i.
//  tensors:   a producer sends nine buffers and drops each at once; the consumer reads them later.
// Without a usable GPU, transform and tensors run on host shared memory (the child doubles the
// values in JavaScript); events has no host form: interprocess events order GPU work.
import { Device } from '../cuda/device.js';
import { Stream } from '../cuda/stream.js';
import { Event } from '../cuda/event.js';
import { BuiltinKernels } from '../cuda/builtins.js';
import { HostBuffer } from '../host/index.js';
import { spawn } from '../link/index.js';
import { countOption, millisecondsOption, UsageError, type ParsedArgs } from './args.js';
import { checkDeviceOrdinal, deviceChoice, whyNoGpu } from './availability.js';

const FORK_NOTE = 'The original example used fork(); CUDA does not survive fork() once initialised, so the child is spawned and gets the memory over a link.';

async function withChild<T>(mode: string, fn: (link: import('../link/index.js').Link) => Promise<T>): Promise<T> {
  const { child, link } = await spawn(new URL('./demo-child.js', import.meta.url), [mode], { stdio: 'inherit' });
  try {
    return await fn(link);
  } finally {
    await link.end();
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
  }
}

async function events(device: Device, ms: number): Promise<number> {
  console.log(FORK_NOTE);
  using stream = Stream.create(device);
  using event = Event.create(device, { interprocess: true });
  const kernels = BuiltinKernels.for(device);
  // The child is started first, so its start-up (Node, CUDA) does not eat the kernel's time.
  const { report, launched } = await withChild('events', async (link) => {
    const launched = performance.now();
    kernels.spin(BigInt(ms) * 1_000_000n, stream);
    event.record(stream);
    console.log(`parent ${process.pid}: launched a ${ms} ms kernel and recorded an interprocess event after it`);
    link.send({ event });
    return { report: (await link.receive()) as { waitedMs: number; pendingAtStart: boolean }, launched };
  });
  await stream.synchronize();
  const total = performance.now() - launched;
  console.log(`parent ${process.pid}: kernel done after ${total.toFixed(0)} ms; the child waited ${report.waitedMs.toFixed(0)} ms (event pending when it started: ${report.pendingAtStart})`);
  if (!report.pendingAtStart) {
    console.error(`demo events: the kernel had finished before the child queued its wait; try a longer kernel (--ms ${ms * 4})`);
    return 1;
  }
  console.log('demo events: OK');
  return 0;
}

async function transform(device: Device, elements: number): Promise<number> {
  console.log(FORK_NOTE);
  using pool = device.createIpcPool();
  using stream = Stream.create(device);
  using buffer = pool.allocate(elements * 4, { stream });
  const kernels = BuiltinKernels.for(device);
  kernels.fillPattern(buffer, 'f32', 100, 1, stream);
  await stream.synchronize();
  const head = () => { const a = new Float32Array(Math.min(5, elements)); buffer.read(a); return Array.from(a).join(', '); };
  console.log(`parent ${process.pid}: initialised ${elements} float32 with a kernel: ${head()}, ...`);
  const report = await withChild('transform', async (link) => {
    link.send({ buffer });
    return (await link.receive()) as { ok: boolean; message?: string };
  });
  if (!report.ok) {
    console.error(`demo transform: the child failed: ${report.message}`);
    return 1;
  }
  const check = await kernels.verifyPattern(buffer, 'f32', 200, 2, stream);
  console.log(`parent ${process.pid}: after the child: ${head()}, ...`);
  if (check.mismatches !== 0n) {
    console.error(`demo transform: ${check.mismatches} elements are not 200 + 2i (first at ${check.firstMismatch})`);
    return 1;
  }
  console.log('demo transform: OK (every element is 200 + 2i)');
  return 0;
}

// The LibTorch producer/consumer sample this project grew from: the producer sends tensors and
// drops them at once; there the consumer read zeros or another tensor's bytes. Here each buffer
// is leased to the consumer, so the producer's close() only gives up its own reference.
async function tensors(device: Device, count: number): Promise<number> {
  const elements = 1 << 16;
  using pool = device.createIpcPool();
  using stream = Stream.create(device);
  const kernels = BuiltinKernels.for(device);
  const released: Promise<void>[] = [];
  const report = await withChild('tensors', async (link) => {
    for (let i = 0; i < count; i++) {
      const tensor = pool.allocate(elements * 4, { stream });
      kernels.fillPattern(tensor, 'f32', i + 1, 0, stream); // every element i + 1
      await stream.synchronize();
      link.send({ index: i, tensor });
      released.push(tensor.released());
      tensor.close(); // the sample's tensor going out of scope
      console.log(`producer ${process.pid}: sent tensor ${i} (all ${i + 1}) and dropped it; leased to ${tensor.leases} peer(s)`);
    }
    link.send({ done: true });
    return (await link.receive()) as { ok: boolean; bad: number[] };
  });
  await Promise.all(released);
  console.log(`producer ${process.pid}: all ${count} tensors freed after the consumer released them`);
  if (!report.ok) {
    console.error(`demo tensors: the consumer read wrong values from tensor(s) ${report.bad.join(', ')}`);
    return 1;
  }
  console.log('demo tensors: OK (no zeros, no foreign bytes)');
  return 0;
}

const floats = (b: HostBuffer) => new Float32Array(b.bytes.buffer, b.bytes.byteOffset, Math.floor(b.byteLength / 4));

async function transformOnHost(elements: number): Promise<number> {
  console.log(FORK_NOTE);
  using buffer = HostBuffer.allocate(elements * 4);
  const values = floats(buffer);
  for (let i = 0; i < elements; i++) values[i] = 100 + i;
  const head = () => Array.from(values.subarray(0, 5)).join(', ');
  console.log(`parent ${process.pid}: initialised ${elements} float32 in host shared memory: ${head()}, ...`);
  const report = await withChild('transform', async (link) => {
    link.send({ buffer });
    return (await link.receive()) as { ok: boolean; message?: string };
  });
  if (!report.ok) {
    console.error(`demo transform: the child failed: ${report.message}`);
    return 1;
  }
  console.log(`parent ${process.pid}: after the child: ${head()}, ...`);
  const bad = values.findIndex((v, i) => v !== 200 + 2 * i);
  if (bad >= 0) {
    console.error(`demo transform: element ${bad} is ${values[bad]}, not ${200 + 2 * bad}`);
    return 1;
  }
  console.log('demo transform: OK (every element is 200 + 2i; host shared memory, no GPU memory was shared)');
  return 0;
}

async function tensorsOnHost(count: number): Promise<number> {
  const elements = 1 << 16;
  const released: Promise<void>[] = [];
  const report = await withChild('tensors', async (link) => {
    for (let i = 0; i < count; i++) {
      const tensor = HostBuffer.allocate(elements * 4);
      floats(tensor).fill(i + 1);
      link.send({ index: i, tensor });
      released.push(tensor.released());
      tensor.close(); // dropped right after sending; the consumer's lease keeps the memory
      console.log(`producer ${process.pid}: sent buffer ${i} (all ${i + 1}) and dropped it; leased to ${tensor.leases} peer(s)`);
    }
    link.send({ done: true });
    return (await link.receive()) as { ok: boolean; bad: number[] };
  });
  await Promise.all(released);
  console.log(`producer ${process.pid}: all ${count} buffers freed after the consumer released them`);
  if (!report.ok) {
    console.error(`demo tensors: the consumer read wrong values from buffer(s) ${report.bad.join(', ')}`);
    return 1;
  }
  console.log('demo tensors: OK (no zeros, no foreign bytes; host shared memory, no GPU memory was shared)');
  return 0;
}

/** Which option belongs to which mode. */
const MODE_OPTIONS = { events: 'ms', transform: 'elements', tensors: 'count' } as const;

export async function demo(args: ParsedArgs): Promise<number> {
  const mode = args.positionals[0] as keyof typeof MODE_OPTIONS; // a choice checked by the parser
  for (const [other, option] of Object.entries(MODE_OPTIONS)) {
    if (other !== mode && args.values[option] !== undefined) {
      throw new UsageError(`--${option} is for 'demo ${other}', not 'demo ${mode}'`);
    }
  }
  // Checked before the GPU is looked for: a bad value is a usage error everywhere.
  const dev = deviceChoice(args);
  const ordinal = dev.ordinal;
  const ms = millisecondsOption(args, 'ms', 500);
  const elements = countOption(args, 'elements', 1 << 20);
  const count = countOption(args, 'count', 9);
  checkDeviceOrdinal(ordinal, dev.explicit, mode === 'events' ? 'see why this demo needs one' : `run demo ${mode} on host shared memory`, dev.option);
  const why = whyNoGpu(ordinal, mode === 'events' ? { ipcEvents: true } : { pools: true });
  if (why !== undefined) {
    if (mode === 'events') {
      // Not a failure: exit 0 with the reason, like `info`.
      console.log(`demo events: skipped, no usable GPU here: ${why}`);
      console.log("Interprocess events order GPU work, so this demo has no host-memory form; 'demo transform' and 'demo tensors' run on host memory here.");
      return 0;
    }
    console.log(`demo ${mode}: no usable GPU here (${why}); running on host shared memory (memfd) instead`);
    return mode === 'transform' ? transformOnHost(elements) : tensorsOnHost(count);
  }
  const device = Device.get(ordinal);
  switch (mode) {
    case 'events': return events(device, ms);
    case 'transform': return transform(device, elements);
    case 'tensors': return tensors(device, count);
  }
}
