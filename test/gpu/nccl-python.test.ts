// NCCL between Node and Python: this process is rank 0 on GPU 0; a Python process with PyTorch
// (test/python/nccl_child.py, cuda_ipc.nccl through ctypes) is rank 1 on GPU 1. Both load PyTorch's
// wheel copy of NCCL (NCCL refuses ranks of different versions, and a process that imported torch
// has that copy loaded already). 256 MiB each way, every value checked. Run on NCCL's own path
// (two GPUs) and, by nccl-python-net.test.ts, on its network path with each process an NCCL host of
// its own (the Python rank on GPU 0 too where there is one GPU). Skips, saying why, without python3
// with torch or the wheel, and on NCCL's own path without two GPUs.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { spawnPython, type Link } from '../../src/link/index.js';
import { NcclCommunicator, NCCL_LIBRARY_ENV, type NcclLibrary } from '../../src/nccl/index.js';
import { wheelLibraries } from '../../src/nccl/discovery.js';
import { PYTHON, pythonFixture, pythonLacks } from '../helpers/python.js';
import { asOwnHost, fewerGpusThan, ncclOrReason, netRankDevice, rate, within, MiB } from '../helpers/nccl-ranks.js';

const onNetwork = process.env.CUDA_IPC_TEST_NCCL_NET === '1';
Object.assign(process.env, { NCCL_NVLS_ENABLE: '0' }, onNetwork ? asOwnHost('node') : {});
const wheels = await wheelLibraries(PYTHON);
const before = (onNetwork ? undefined : fewerGpusThan(2)) ?? pythonLacks('torch') ?? (wheels.paths.length ? undefined : `PyTorch's NCCL wheel is not found: ${wheels.why}`);
const nccl = before ? before : await ncclOrReason(wheels.paths[0]);
const skip = typeof nccl === 'string' ? nccl : undefined;

async function askPython(link: Link, msg: Record<string, unknown>): Promise<any> {
  link.send(msg);
  const reply = await link.receive({ signal: AbortSignal.timeout(300_000) }) as any;
  if (reply && typeof reply === 'object' && 'error' in reply) assert.fail(`Python failed '${String(msg.op)}':\n${reply.error}`);
  return reply;
}

describe(`NCCL between Node and Python (PyTorch), ${onNetwork ? 'its network path' : 'its own path'}`, { skip }, () => {
  test('256 MiB each way between a Node rank and a Python rank, every value checked', async (t) => {
    const library = nccl as NcclLibrary;  // the suite is skipped otherwise
    const here = Device.get(0);
    const there = onNetwork ? netRankDevice(1).ordinal : 1;
    const { child, link } = await spawnPython(pythonFixture('nccl_child.py'), [], {
      stdio: 'inherit', env: { ...process.env, [NCCL_LIBRARY_ENV]: library.path, ...(onNetwork && asOwnHost('python')) },
    });
    const exited = new Promise((r) => child.once('exit', r));
    try {
      const id = library.uniqueId();
      const [comm, reply] = await within(Promise.all([
        NcclCommunicator.init({ uniqueId: id, nranks: 2, rank: 0, device: here, library, timeout: 120_000 }),
        askPython(link, { op: 'init', id, nranks: 2, rank: 1, ordinal: there }),
      ]), 180_000, 'creating the communicator');
      t.diagnostic(`NCCL ${library.version} (${library.path}) in both`);
      assert.deepEqual([reply.version, reply.rank, reply.nranks, reply.cuda_device], [library.version, 1, 2, there]);
      assert.equal(comm.cudaDevice, here.ordinal);

      const bytes = 256 * MiB;
      const kernels = BuiltinKernels.for(here);
      using stream = Stream.create(here);
      using b = DeviceBuffer.allocate(bytes, { device: here });
      kernels.fillPattern(b, 'u32', 1000, 1, stream);  // int32 seed + i in Python: below 2^31
      await stream.synchronize();
      let t0 = performance.now();
      const [, received] = await within(Promise.all([
        comm.send(b, bytes, 1, { stream }).then(() => stream.synchronize()),
        askPython(link, { op: 'recv', bytes, peer: 0, seed: 1000 }),
      ]), 300_000, 'Node -> Python');
      t.diagnostic(`Node -> Python: ${rate(bytes, performance.now() - t0)}`);
      assert.equal(received.mismatches, 0, 'Python received every value');

      b.fill(0, { stream });
      await stream.synchronize();
      t0 = performance.now();
      await within(Promise.all([
        comm.recv(b, bytes, 1, { stream }).then(() => stream.synchronize()),
        askPython(link, { op: 'send', bytes, peer: 0, seed: 2000 }),
      ]), 300_000, 'Python -> Node');
      t.diagnostic(`Python -> Node: ${rate(bytes, performance.now() - t0)}`);
      assert.equal(Number((await kernels.verifyPattern(b, 'u32', 2000, 1, stream)).mismatches), 0, 'Node received every value');

      await within(Promise.all([comm.close({ timeout: 120_000 }), askPython(link, { op: 'close' })]), 180_000, 'the collective close');
    } finally {
      if (!link.closed) link.send({ op: 'exit' });
      const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    }
  });
});
