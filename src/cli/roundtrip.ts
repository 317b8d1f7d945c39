// `cuda-ipc roundtrip`: hand a buffer from an IPC pool to a spawned child and back. The parent
// fills 100, 101, ...; the child verifies and writes 0, -1, -2, ...; the parent verifies.
// Where CUDA IPC is not available it says why and runs the same round trip on host shared memory.
import { totalmem } from 'node:os';
import { Device } from '../cuda/device.js';
import { Stream } from '../cuda/stream.js';
import { IpcPool } from '../ipc/pool.js';
import { HostBuffer } from '../host/index.js';
import { spawn } from '../link/index.js';
import { countOption, UsageError, type ParsedArgs } from './args.js';
import { checkDeviceOrdinal, deviceChoice, whyNoGpu } from './availability.js';
import { devicePatternMemory, hostPatternMemory, type PatternMemory } from './roundtrip-memory.js';

interface ChildReport { ok: boolean; mismatches?: number; message?: string }

async function exchange(transfer: unknown, elements: number, mine: PatternMemory, label: string): Promise<number> {
  await mine.fill(100, 1);
  console.log(`parent ${process.pid}: filled ${elements} int32 (${label}): ${mine.firstFive().join(', ')}, ...`);
  const { child, link } = await spawn(new URL('./roundtrip-child.js', import.meta.url), [], { stdio: 'inherit' });
  try {
    link.send({ buffer: transfer, elements });
    const report = (await link.receive()) as ChildReport;
    if (!report.ok) {
      console.error(`child reported: ${report.message}`);
      return 1;
    }
    const bad = await mine.mismatches(0, -1);
    console.log(`parent ${process.pid}: after the child: ${mine.firstFive().join(', ')}, ...`);
    if (bad !== 0) {
      console.error(`IPC round-trip: FAILED (${bad} of ${elements} elements are not 0, -1, -2, ...)`);
      return 1;
    }
    return 0;
  } finally {
    link.close();
    await new Promise((resolve) => (child.exitCode !== null ? resolve(null) : child.once('exit', resolve)));
  }
}

export async function roundtrip(args: ParsedArgs): Promise<number> {
  const elements = countOption(args, 'elements', 1024);
  const dev = deviceChoice(args);
  const ordinal = dev.ordinal;
  const bytes = elements * 4;
  checkDeviceOrdinal(ordinal, dev.explicit, 'run the round trip on host shared memory', dev.option);

  const why = whyNoGpu(ordinal, { pools: true });
  if (why !== undefined) {
    console.log(`CUDA IPC is not available here: ${why}`);
    console.log('Running the same round trip on host shared memory (memfd) instead.');
    // Both processes touch every page: more than the machine has would end in the OOM killer.
    if (bytes > totalmem()) {
      throw new UsageError(`--elements ${elements} needs ${bytes} bytes of host memory, more than this machine has (${totalmem()}); ask for fewer`);
    }
    using host = HostBuffer.allocate(bytes);
    const code = await exchange(host, elements, hostPatternMemory(host), 'host shared memory');
    if (code === 0) console.log('IPC round-trip: OK (host shared memory; no GPU memory was shared)');
    return code;
  }

  const device = Device.get(ordinal);
  console.log(`device ${device.ordinal}: ${device.name}, compute capability ${device.computeCapability.major}.${device.computeCapability.minor}`);
  using pool = device.createIpcPool();
  using stream = Stream.create(device);
  using buffer = pool.allocate(bytes, { stream });
  const code = await exchange(buffer, elements, devicePatternMemory(buffer, stream), `IPC pool on device ${device.ordinal}`);
  if (code === 0) console.log('IPC round-trip: OK');
  return code;
}
