// The Python companion on the GPU: Node pool and legacy buffers viewed zero-copy by PyTorch (through
// __cuda_array_interface__ and DLPack), CuPy, Numba and cuda.core (its own IPC import, and a wrap);
// a Node legacy buffer opened through PyTorch's own handle format; PyTorch tensors (caching-allocator
// sub-allocations, views with storage offsets), a CuPy array and a cuda.core pool buffer sent to Node,
// written by Node, checked by Python, kept alive by their leases, and sent back. Values are checked
// everywhere. Needs a GPU and python3 with torch (and cupy, numba, cuda.core for their cases, which
// report a skip where the library is missing).
import { describe, test, before, after, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { noGpu } from '../helpers/gpu.js';
import { noPython, pythonFixture, pythonLacks } from '../helpers/python.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { spawnPython, type Link, type SpawnedChild } from '../../src/link/index.js';
import { torchHandleOf } from '../../src/ipc/torch-handle.js';
import '../../src/ipc/legacy.js';
import '../../src/ipc/pool.js';

const skip = noGpu ?? noPython;
const noTorch = skip ?? pythonLacks('torch');
const N = 4096;

function pattern(n = N): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => i * 0.5 + 1);
}

function floats(b: DeviceBuffer, n = N): Float32Array {
  const bytes = b.read();
  return new Float32Array(bytes.buffer, bytes.byteOffset, n);
}

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  const reply = await link.receive({ signal: AbortSignal.timeout(60_000) }) as any;
  if (reply && typeof reply === 'object' && 'error' in reply) assert.fail(`Python failed:\n${reply.error}`);
  return reply;
}

/** The reply, or a skip of the test with Python's reason. */
function skipped(t: TestContext, reply: any): boolean {
  if (reply && typeof reply === 'object' && 'skipped' in reply) {
    t.skip(reply.skipped);
    return true;
  }
  return false;
}

function releasedSoon(b: DeviceBuffer, ms = 5000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`not released within ${ms} ms (${b.leases} leases)`)), ms); });
  return Promise.race([b.released(), late]).finally(() => clearTimeout(timer));
}

describe('Python companion on the GPU', { skip }, () => {
  let spawned: SpawnedChild;
  let link: Link;
  let device: Device;
  let pool: import('../../src/ipc/pool.js').IpcPool;

  before(async () => {
    device = Device.get(0);
    pool = device.createIpcPool();
    spawned = await spawnPython(pythonFixture('gpu_child.py'), [], { stdio: ['ignore', 'inherit', 'inherit'] });
    link = spawned.link;
  });

  after(async () => {
    await link?.end();
    if (spawned && spawned.child.exitCode === null) await once(spawned.child, 'exit');
    pool?.close();
    corePool?.close();
  });

  // cuda.core imports the pool of its buffers itself: give it a pool that cuda_ipc never mapped in
  // that process (one pool imported twice in a process is not something to rely on).
  let corePool: import('../../src/ipc/pool.js').IpcPool | undefined;
  const kinds = {
    pool: () => pool.allocate(4 * N),
    corePool: () => (corePool ??= device.createIpcPool()).allocate(4 * N),
    legacy: () => DeviceBuffer.allocate(4 * N, { device }),
  };
  const cases: Array<{ op: string; what: string; after: (i: number) => number; kinds: Array<keyof typeof kinds> }> = [
    { op: 'torch-cai', what: 'torch.as_tensor (__cuda_array_interface__)', after: (i) => (i * 0.5 + 1) * 2, kinds: ['pool', 'legacy'] },
    { op: 'torch-dlpack', what: 'torch.from_dlpack', after: (i) => i * 0.5 + 2, kinds: ['pool', 'legacy'] },
    { op: 'cupy', what: 'cupy.asarray', after: (i) => -(i * 0.5 + 1), kinds: ['pool', 'legacy'] },
    { op: 'numba', what: 'numba.cuda.as_cuda_array', after: (i) => (i * 0.5 + 1) * 3, kinds: ['pool', 'legacy'] },
    { op: 'cuda-core', what: "cuda.core's own IPC import (from_allocation_handle + from_ipc_descriptor)", after: () => 7, kinds: ['corePool'] },
    { op: 'cuda-core-wrap', what: 'a cuda.core Buffer over the mapping (to_cuda_core)', after: (i) => i * 0.5 + 1, kinds: ['pool', 'legacy'] },
  ];
  for (const c of cases) {
    for (const kind of c.kinds) {
      test(`a Node ${kind === 'corePool' ? 'pool' : kind} buffer viewed zero-copy by ${c.what}, values both ways`, async (t) => {
        const buffer = kinds[kind]();
        buffer.write(pattern());
        // A view at an offset, so that the range (not just the allocation) travels.
        const reply = await ask(link, { op: c.op, buffer, n: N });
        if (skipped(t, reply)) { buffer.close(); return; }
        assert.equal(reply.ok, true, JSON.stringify(reply));
        const got = floats(buffer);
        for (let i = 0; i < N; i++) if (got[i] !== c.after(i)) assert.fail(`element ${i}: ${got[i]} after ${c.op}, expected ${c.after(i)}`);
        buffer.close();
        await releasedSoon(buffer);
      });
    }
  }

  test('a view of a Node pool buffer at an offset arrives at its offset', { skip: noTorch }, async () => {
    using whole = pool.allocate(4 * (N + 256));
    const values = new Float32Array(N + 256).fill(-9);
    values.set(pattern(), 256);
    whole.write(values);
    const view = whole.view(4 * 256, 4 * N);
    assert.equal((await ask(link, { op: 'torch-cai', buffer: view, n: N })).ok, true);
    view.close();
    const got = floats(whole, N + 256);
    assert.equal(got[255], -9);
    assert.equal(got[256], 2);
    assert.equal(got[256 + N - 1], ((N - 1) * 0.5 + 1) * 2);
  });

  test("a Node legacy buffer opened through PyTorch's own handle format (_new_shared_cuda)", { skip: noTorch }, async () => {
    using buffer = DeviceBuffer.allocate(4 * N + 4096, { device });
    const part = buffer.view(4096, 4 * N);
    part.write(pattern());
    const torch = torchHandleOf(part.ipcHandle());
    assert.equal(torch.storageOffsetBytes, 4096);
    const reply = await ask(link, { op: 'torch-format', handle: Buffer.from(torch.handle).toString('hex'), size: torch.storageSizeBytes, offset: torch.storageOffsetBytes, n: N, device: 0 });
    assert.equal(reply.ok, true);
    assert.ok(floats(part).every((v) => v === -1), 'torch wrote through its own mapping of our memory');
    part.close();
  });

  for (const kind of ['sub', 'view'] as const) {
    test(`a PyTorch tensor (${kind === 'sub' ? 'a caching-allocator sub-allocation' : 'a view with a storage offset'}) to Node and back`, { skip: noTorch }, async () => {
      const index = kind === 'sub' ? 0 : 1;
      link.send({ op: 'send-torch', n: N, kind });
      const msg = await link.receive({ signal: AbortSignal.timeout(60_000) }) as any;
      if (msg.error) assert.fail(msg.error);
      const tensor = msg.tensor as DeviceBuffer;
      assert.ok(tensor instanceof DeviceBuffer, 'a torch tensor arrives as a DeviceBuffer');
      assert.equal(tensor.byteLength, 4 * msg.n);
      assert.ok(msg.offsetInBlock > 0, `the tensor lies ${msg.offsetInBlock} bytes into its caching-allocator block`);
      const first = kind === 'sub' ? 0 : 1.25;
      const got = floats(tensor, msg.n);
      assert.deepEqual(Array.from(got.subarray(0, 4)), msg.first);
      for (let i = 0; i < msg.n; i++) if (got[i] !== first + i * 0.25) assert.fail(`element ${i}: ${got[i]}`);
      // Node writes; Python sees it in its tensor's memory.
      const negated = got.map((v) => -v);
      tensor.write(negated);
      assert.equal((await ask(link, { op: 'check-sent', index, values: Array.from(negated.subarray(0, 64)) })).ok, true);
      // Python drops its tensor and allocates a lot: the lease keeps the block from being reused.
      assert.equal((await ask(link, { op: 'churn', index })).reused, false);
      assert.equal((await ask(link, { op: 'check-sent', index, values: Array.from(negated.subarray(0, 64)) })).ok, true);
      // Sent back, it maps to Python's own memory.
      assert.equal((await ask(link, { op: 'back', buffer: tensor, index })).ok, true);
      tensor.close();
    });
  }

  test('a CuPy array and a cuda.core pool buffer to Node', async (t) => {
    link.send({ op: 'send-cupy', n: N });
    let msg = await link.receive({ signal: AbortSignal.timeout(60_000) }) as any;
    if (msg.error) assert.fail(msg.error);
    if (!skipped(t, msg)) {
      const a = msg.array as DeviceBuffer;
      assert.equal(a.kind, 'legacy-import');
      const got = floats(a);
      for (let i = 0; i < N; i++) if (got[i] !== i * 2) assert.fail(`cupy element ${i}: ${got[i]}`);
      a.close();
    }
    link.send({ op: 'send-cuda-core', n: N });
    msg = await link.receive({ signal: AbortSignal.timeout(60_000) }) as any;
    if (msg.error) assert.fail(msg.error);
    if (skipped(t, msg)) return;
    const b = msg.buffer as DeviceBuffer;
    assert.equal(b.kind, 'pool-import', 'memory of an IPC-enabled cuda.core resource travels as a pool buffer');
    const got = floats(b);
    for (let i = 0; i < N; i++) if (got[i] !== i * 1.5) assert.fail(`cuda.core element ${i}: ${got[i]}`);
    b.close();
  });

  test('every lease ended on both sides', async () => {
    await new Promise((r) => setTimeout(r, 50));
    const py = await ask(link, { op: 'leases' });
    assert.deepEqual(py, { count: 0, received: 0 }, 'Python holds nothing of ours and we hold nothing of Python\'s');
    assert.equal(link.leases.count, 0);
  });
});
