// Child of the channel benchmarks. argv[2]:
//   echo <wait> [spinUs]  accepts an input and an output channel; sends each message back; ends
//                         with { cpu, ranOn }: ranOn is the CPU it ran on when timing began
//   sink <wait> [spinUs]  consumes: reads the first word of each message, releases it
//   worker                work-sharing consumer: as sink
//   kernel <elements> <n> GPU: times a reading kernel on a received device slot and on memory of
//                         its own; replies { sharedUs, localUs }
//   protocol-echo         accepts an input and an output channel on the C ring; echoes messages
//                         calling the ring directly until a STOP (the protocol floor, channel-floors.ts)
//   protocol-sink         accepts an input channel on the C ring; takes messages calling the ring
//                         directly until a STOP (the one-way protocol floor); ends with { cpu, n, sum }
//   doorbell-echo         no channel: rings doorbell 0 each time doorbell 1 rings (the floor of
//                         the wake-up: an eventfd written by one process, polled by the other's
//                         event loop, both ways)
//   socket-echo <path>    no channel: connects to a Unix socket and echoes what it reads
//   spin-echo             no channel: receives { buffer, rounds }; bumps the word at 64 each time
//                         the word at 0 moved, spinning as a channel end in spin mode does (the
//                         floor under spin mode); ends with { cpu }: the CPU it last ran on
// echo, sink and worker also say how often their ends slept on the doorbell ({ sleeps }) and where their main thread ran: { ranOn, allowed (its CPU list),
// pinned (false: the CPU the bench named could not be set) }.
// Channel modes and doorbell-echo end with { n?, cpu }: this process's CPU time (user + system,
// microseconds) from the first timed message (after the parent's warm-up) or the start of work.
import { connect as netConnect } from 'node:net';
import { parentLink } from '../src/link/index.js';
import { acceptChannel, type WaitMode } from '../src/channel/index.js';
import type { Doorbells } from '../src/channel/doorbells.js';
import { Stream } from '../src/cuda/stream.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { BuiltinKernels } from '../src/cuda/builtins.js';
import { arg } from '../src/cuda/kernel-args.js';
import { addon } from '../src/native/addon.js';
import type { HostBuffer } from '../src/host/index.js';
import { JsWords } from '../src/channel/js-words.js';
import { allowedCpus, onCpu, pinFromEnv } from './placement.js';
import { directEnd, directReceive, directSend, STOP, waitsOf } from './channel-floors.js';

const pinned = pinFromEnv();  // on the CPU the bench named (placement.ts)
/** Where this child's main thread ran and what it was allowed (the bench prints it per row). */
const where = () => ({ ranOn: onCpu(), allowed: allowedCpus(), pinned });
const link = parentLink();
const mode = process.argv[2];
const wait = (process.argv[3] as WaitMode | undefined) ?? 'adaptive';
const spinMicros = (mode === 'echo' || mode === 'sink') && process.argv[4] ? Number(process.argv[4]) : undefined;
const cpuSince = (start: NodeJS.CpuUsage) => {
  const u = process.cpuUsage(start);
  return u.user + u.system;
};

if (mode === 'echo') {
  const input = await acceptChannel(link, { wait, spinMicros, role: 'consumer' });
  const output = await acceptChannel(link, { wait, spinMicros, role: 'producer' });
  const stream = output.device ? Stream.create(output.device) : undefined;
  let cpu0 = process.cpuUsage();
  let ranOn = -1;
  for await (const msg of input) {
    // The parent marks its first timed message with length 2: CPU is counted from there.
    if (msg.length === 2) {
      cpu0 = process.cpuUsage();
      ranOn = onCpu();
    }
    const slot = await output.acquire({ stream });
    if (stream) msg.waitOn(stream);
    else slot.bytes[0] = msg.bytes[0]!;
    output.publish(slot, { stream, length: 1 });
    msg.release({ stream });
  }
  const cpu = cpuSince(cpu0);
  await output.end();
  const sleeps = waitsOf(input).sleeps + waitsOf(output).sleeps;
  input.close();
  link.send({ cpu, ranOn, allowed: allowedCpus(), pinned, sleeps });
} else if (mode === 'sink' || mode === 'worker') {
  const input = await acceptChannel(link, { wait, spinMicros, role: 'consumer' });
  const stream = input.device ? Stream.create(input.device) : undefined;
  let n = 0;
  let sum = 0;
  const cpu0 = process.cpuUsage();
  for await (const msg of input) {
    if (stream) msg.waitOn(stream);
    else sum += msg.bytes[0]!;  // reads the message
    n++;
    msg.release({ stream });
  }
  const cpu = cpuSince(cpu0);
  const sleeps = waitsOf(input).sleeps;
  input.close();
  link.send({ n, sum, cpu, ...where(), sleeps });
} else if (mode === 'protocol-echo') {
  // The protocol floor's far end (channel-floors.ts): the C ring driven directly, spinning.
  const input = await acceptChannel(link, { wait: 'spin', role: 'consumer' });
  const output = await acceptChannel(link, { wait: 'spin', role: 'producer' });
  const i = directEnd(input);
  const o = directEnd(output);
  const limit = performance.now() + 60_000;
  for (let v = directReceive(i, limit); v !== STOP; v = directReceive(i, limit)) directSend(o, v, limit);
  const cpu = onCpu();
  await output.end();
  input.close();
  link.send({ cpu });
} else if (mode === 'protocol-sink') {
  // The one-way protocol floor's consumer: takes and releases messages until a STOP.
  const input = await acceptChannel(link, { wait: 'spin', role: 'consumer' });
  const i = directEnd(input);
  const limit = performance.now() + 60_000;
  let n = 0;
  let sum = 0;
  for (let v = directReceive(i, limit); v !== STOP; v = directReceive(i, limit)) {
    n++;
    sum += v;
  }
  const cpu = onCpu();
  input.close();
  link.send({ cpu, n, sum });
} else if (mode === 'doorbell-echo') {
  const { bells, warmup } = (await link.receive()) as { bells: Doorbells; warmup: number };
  let cpu0 = process.cpuUsage();
  let rung = 0;
  const bell = new addon.Doorbell(bells.fd(1), () => {
    // CPU is counted from the first timed wake-up on.
    if (++rung === warmup + 1) cpu0 = process.cpuUsage();
    bells.ring(0);
  });
  bell.ref();
  link.send({ ready: true });
  await link.receive();  // the parent is done
  bell.close();
  const cpu = cpuSince(cpu0);
  bells.close();
  link.send({ cpu });
} else if (mode === 'spin-echo') {
  const { buffer, rounds } = (await link.receive()) as { buffer: HostBuffer; rounds: number };
  const words = new JsWords(new addon.SharedWords(buffer.fd, 4096), buffer.bytes);
  link.send({ ready: true });
  const limit = performance.now() + 20_000;
  for (let i = 0; i < rounds; i++) {
    while (!words.spinWait32(0, i, 1000)) {
      if (performance.now() > limit) throw new Error('spin-echo: the parent stopped bouncing');
    }
    words.add32(64, 1);
  }
  const cpu = onCpu();
  words.close();
  buffer.close();
  link.send({ cpu });
} else if (mode === 'socket-echo') {
  const socket = netConnect(process.argv[3]!);
  socket.setNoDelay(true);
  socket.on('data', (d) => socket.write(d));
  await new Promise<void>((resolve) => socket.once('close', () => resolve()));
} else if (mode === 'kernel') {
  const input = await acceptChannel(link, { role: 'consumer' });
  const reps = Number(process.argv[4] ?? 20);
  const say = (what: string) => process.stderr.write(`  [kernel child] ${what}\n`);
  const msg = (await input.receive())!;
  say('received the slot');
  const shared = msg.buffer as DeviceBuffer;
  const device = shared.device;
  const stream = Stream.create(device);
  msg.waitOn(stream);
  using local = DeviceBuffer.allocate(shared.byteLength, { device });
  local.copyFrom(shared, { stream });
  using sums = DeviceBuffer.allocate(16, { device });
  const kernel = BuiltinKernels.for(device).kernel('checksum_bytes');
  const grid = Math.max(1, Math.min(Math.ceil(shared.byteLength / 16 / 256), device.multiprocessors * 16));
  const time = async (buf: DeviceBuffer) => {
    const samples: number[] = [];
    for (let r = 0; r < reps; r++) {
      await stream.synchronize();
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < 10; i++) kernel.launch({ grid, block: 256, stream }, [arg.ptr(buf), arg.u64(BigInt(buf.byteLength)), arg.ptr(sums)]);
      await stream.synchronize();
      samples.push(Number(process.hrtime.bigint() - t0) / 1000 / 10);
    }
    return samples;
  };
  await time(local);  // warm-up
  say('warmed up');
  // Alternate so that clock changes hit both alike.
  const sharedUs: number[] = [];
  const localUs: number[] = [];
  for (let round = 0; round < 3; round++) {
    sharedUs.push(...await time(shared));
    localUs.push(...await time(local));
  }
  say('timed; releasing');
  msg.release({ stream });
  await stream.synchronize();
  stream.close();
  input.close();
  link.send({ sharedUs, localUs });
  say('sent the timings');
}
await link.end();
