// Child of the channel benchmarks. argv[2]:
//   echo <wait>           accepts an input and an output channel; sends each message back
//   sink <wait>           consumes: reads the first word of each message, releases it
//   worker                work-sharing consumer: as sink
//   kernel <elements> <n> GPU: times a reading kernel on a received device slot and on memory of
//                         its own; replies { sharedUs, localUs }
//   raw-echo              no channel: answers each change of word 0 of a received HostBuffer by
//                         writing it to word 16, waiting the way 'futex' channels do (the floor)
import { parentLink } from '../src/link/index.js';
import { acceptChannel } from '../src/channel/index.js';
import { Stream } from '../src/cuda/stream.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { BuiltinKernels } from '../src/cuda/builtins.js';
import { arg } from '../src/cuda/kernel-args.js';
import { addon } from '../src/native.js';
import { Sleeper } from '../src/channel/sleeper.js';
import type { HostBuffer } from '../src/host/index.js';

const link = parentLink();
const mode = process.argv[2];
const wait = (process.argv[3] as 'futex' | 'spin' | undefined) ?? 'futex';

if (mode === 'echo') {
  const input = await acceptChannel(link, { wait });
  const output = await acceptChannel(link, { wait });
  const stream = output.device ? Stream.create(output.device) : undefined;
  for await (const msg of input) {
    const slot = await output.acquire({ stream });
    if (stream) msg.waitOn(stream);
    else slot.bytes[0] = msg.bytes[0]!;
    output.publish(slot, { stream, length: 1 });
    msg.release({ stream });
  }
  await output.end();
  input.close();
} else if (mode === 'sink' || mode === 'worker') {
  const input = await acceptChannel(link, { wait });
  const stream = input.device ? Stream.create(input.device) : undefined;
  let n = 0;
  for await (const msg of input) {
    if (stream) msg.waitOn(stream);
    else n += msg.bytes[0]!;
    msg.release({ stream });
  }
  input.close();
  link.send({ n });
} else if (mode === 'raw-echo') {
  const { control } = (await link.receive()) as { control: HostBuffer };
  const words = new addon.SharedWords(control.fd, control.byteLength);
  const sleeper = new Sleeper();
  link.send({ ready: true });
  for (let last = 0; ;) {
    let v: number;
    while ((v = words.load32(0)) === last) await sleeper.wait(words, 0, last, 1000);
    if (v === 0xffffffff) break;
    last = v;
    words.store32(64, v);
    words.wake(64, 1);
  }
  sleeper.close();
  words.close();
  control.close();
} else if (mode === 'kernel') {
  const input = await acceptChannel(link);
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
