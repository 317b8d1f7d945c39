// Peer IPC: a process working on one GPU uses memory another process allocated on another.
// Each two-GPU path also runs within GPU 0 (the child spawned with { device: GPU 0 }), so a
// one-GPU machine checks everything but the peer access itself; the two-GPU tests skip there
// with the reason.
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readdirSync } from 'node:fs';
import { spawnSync, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { noPeerPair, settle } from '../helpers/peer.js';
import { u32Pattern } from '../helpers/child.js';
import { Device, peerLinks, setWorkingDevice, workingDevice } from '../../src/cuda/device.js';
import { DeviceBuffer, deviceMemoryStats } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { arg } from '../../src/cuda/kernel-args.js';
import { openIpcHandle } from '../../src/ipc/legacy.js';
import { spawn, setLinkWorkingDevice, type Link, type SpawnOptions } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';

const CHILD = new URL('../fixtures/peer-child.js', import.meta.url);
const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const MiB = 1 << 20;
const NO_SUCH_GPU = 'GPU-00000000-1111-2222-3333-444444444444';
const fdCount = () => readdirSync('/proc/self/fd').length;
const children = new Set<ChildProcess>();
after(() => { for (const c of children) c.kill('SIGKILL'); });

async function ask(link: Link, msg: unknown): Promise<any> {
  link.send(msg);
  return link.receive({ signal: AbortSignal.timeout(60_000) });
}

async function withChild<T>(options: SpawnOptions, fn: (link: Link) => Promise<T>): Promise<T> {
  const { child, link } = await spawn(CHILD, [], { stdio: 'inherit', ...options });
  children.add(child);
  const exited = once(child, 'exit');
  try {
    return await fn(link);
  } finally {
    if (!link.closed) link.send({ op: 'exit' });
    await exited;
    children.delete(child);
  }
}

function closed(link: Link): Promise<IpcError | undefined> {
  return link.closed ? Promise.resolve(undefined) : new Promise((resolve) => link.once('close', resolve));
}

const scaled = (seed: number, n: number, s: number) => u32Pattern(seed, n).map((v) => Math.imul(v, s) >>> 0);

/**
 * A pool buffer and a plain (legacy-handle) buffer allocated here on `resident`, sent to a child
 * working on `user`: its kernels verify them and triple them there; the values are checked here.
 */
async function kernelInChild(resident: Device, user: Device, options: SpawnOptions = {}): Promise<void> {
  const n = 1 << 20;
  using pool = resident.createIpcPool();
  using a = pool.allocate(n * 4);
  using b = DeviceBuffer.allocate(n * 4, { device: resident });
  a.write(u32Pattern(11, n));
  b.write(u32Pattern(11, n));
  await withChild({ device: user, ...options }, async (link) => {
    const who = await ask(link, { op: 'whoami' });
    assert.equal(who.working, user.uuid, JSON.stringify(who));
    const r = await ask(link, { op: 'kernel', buffers: [a, b], seed: 11, scale: 3 });
    assert.equal(r.ok, true, JSON.stringify(r));
    const pick = (x: any) => ({ kind: x.kind, device: x.device, resident: x.resident, mismatches: x.mismatches, handleUuid: x.handleUuid });
    assert.deepEqual(r.buffers.map(pick), [
      { kind: 'pool-import', device: user.uuid, resident: resident.uuid, mismatches: 0, handleUuid: null },
      { kind: 'legacy-import', device: user.uuid, resident: resident.uuid, mismatches: 0, handleUuid: resident.uuid },
    ]);
  });
  const want = scaled(11, n, 3);
  for (const buf of [a, b]) {
    const got = new Uint32Array(n);
    buf.read(got);
    assert.deepEqual(got, want, `the ${buf.kind} buffer holds what the child's kernel wrote`);
  }
}

/**
 * Children working on `user` map a pool buffer and a plain buffer of `resident`, use them in a
 * kernel and are SIGKILLed holding them; afterwards nothing is left on either GPU or in fds.
 */
async function killedConsumers(resident: Device, user: Device, cycles: number): Promise<void> {
  using pool = resident.createIpcPool();
  pool.allocate(MiB).close(); // the pool's first reservation stays: warm up before the baseline
  resident.memoryInfo();
  user.memoryInfo(); // this process's contexts exist before the baseline
  const fdsBefore = fdCount();
  const freeResident = resident.memoryInfo().free;
  const freeUser = user.memoryInfo().free;
  for (let c = 0; c < cycles; c++) {
    const { child, link } = await spawn(CHILD, [], { device: user, stdio: 'inherit' });
    children.add(child);
    const exited = once(child, 'exit');
    const a = pool.allocate(MiB);
    const b = DeviceBuffer.allocate(MiB, { device: resident });
    a.write(u32Pattern(c, MiB / 4));
    b.write(u32Pattern(c, MiB / 4));
    assert.deepEqual(await ask(link, { op: 'hold', buffers: [a, b] }), { ok: true, count: 2 });
    a.close();
    b.close(); // only the child's leases keep them now
    const gone = closed(link);
    child.kill('SIGKILL');
    assert.equal((await gone)?.code, 'ERR_PEER_GONE');
    await Promise.all([a.released(), b.released()]);
    await exited;
    children.delete(child);
  }
  const stats = deviceMemoryStats();
  assert.deepEqual([stats.heldBytes, stats.leased, stats.imports], [0, 0, 0]);
  assert.equal(await settle(fdCount, fdsBefore, 0), fdsBefore, 'file descriptors back to where they started');
  pool.trimTo(0);
  const tolerance = 8 * MiB;
  const r = await settle(() => resident.memoryInfo().free, freeResident, tolerance);
  assert.ok(Math.abs(r - freeResident) <= tolerance, `free memory of the resident device moved from ${freeResident} to ${r}`);
  const u = await settle(() => user.memoryInfo().free, freeUser, tolerance);
  assert.ok(Math.abs(u - freeUser) <= tolerance, `free memory of the child's device moved from ${freeUser} to ${u}`);
}

/**
 * A child working on `childDevice` allocates a pool buffer there and sends it; this process maps
 * it for `here` (the link's working device), the child is SIGKILLed, then (`readable`) a kernel here
 * still reads the buffer, and once it is closed the child's GPU gets its memory back. On one GPU the
 * driver keeps a dead exporter's memory for its importers; across GPUs it does not (two H200s over
 * NVLink: the read fails with CUDA_ERROR_CONTAINED, which ends the reader's context), so there the
 * buffer is only closed.
 */
async function killedProducer(here: Device, childDevice: Device, readable: boolean): Promise<void> {
  {
    // This process's own first kernel on `here` (module, stream, launch resources) comes before
    // the baseline: on one GPU, `here` is the child's GPU too.
    using stream = Stream.create(here);
    using warm = DeviceBuffer.allocate(4096, { device: here });
    warm.fill(0);
    await BuiltinKernels.for(here).verifyPattern(warm, 'u32', 0, 0, stream);
  }
  const fdsBefore = fdCount();
  const freeBefore = childDevice.memoryInfo().free;
  const { child, link } = await spawn(CHILD, [], { device: childDevice, stdio: 'inherit' });
  children.add(child);
  const exited = once(child, 'exit');
  setLinkWorkingDevice(link, here);
  const r = await ask(link, { op: 'allocate', bytes: 4 * MiB, seed: 500 });
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.device, childDevice.uuid);
  const buffer = r.buffer as DeviceBuffer;
  assert.equal(buffer.device, here, 'mapped for the link\'s working device');
  assert.equal(buffer.residentDevice, childDevice, 'it lives on the child\'s GPU');
  const gone = closed(link);
  child.kill('SIGKILL');
  assert.equal((await gone)?.code, 'ERR_PEER_GONE');
  await exited;
  children.delete(child);
  if (readable) {
    // Not `using`: when the read fails, a failing close would hide its error in a SuppressedError.
    const stream = Stream.create(here);
    let check;
    try {
      check = await BuiltinKernels.for(here).verifyPattern(buffer, 'u32', 500, 1, stream);
    } catch (e) {
      try {
        stream.close();
      } catch (closing) {
        throw new Error(`reading the dead exporter's buffer failed (${String(e)}); closing the stream then failed too (${String(closing)})`, { cause: e });
      }
      throw e;
    }
    stream.close();
    assert.equal(check.mismatches, 0n, 'the mapping stays readable after its exporter died');
  }
  buffer.close();
  await buffer.released();
  assert.equal(deviceMemoryStats().imports, 0);
  assert.equal(await settle(fdCount, fdsBefore, 0), fdsBefore, 'the imported pool\'s fd was closed');
  const tolerance = 8 * MiB;
  const free = await settle(() => childDevice.memoryInfo().free, freeBefore, tolerance);
  assert.ok(Math.abs(free - freeBefore) <= tolerance, `free memory of the child's device moved from ${freeBefore} to ${free}`);
}

describe('peer IPC, within one GPU', { skip: noGpu }, () => {
  test('peer attributes: the device itself, and every pair the driver reports', (t) => {
    const all = Device.all();
    const d0 = all[0]!;
    assert.deepEqual(d0.peerAttributes(d0), { accessSupported: true, nativeAtomics: true, performanceRank: 0 });
    const links = peerLinks();
    assert.equal(links.length, all.length * (all.length - 1));
    for (const l of links) {
      assert.notEqual(l.from, l.to);
      assert.equal(typeof l.accessSupported, 'boolean');
      assert.equal(typeof l.nativeAtomics, 'boolean');
      assert.ok(Number.isInteger(l.performanceRank) && l.performanceRank >= 0, `rank ${l.performanceRank}`);
      t.diagnostic(`${l.from.ordinal} -> ${l.to.ordinal}: access ${l.accessSupported}, native atomics ${l.nativeAtomics}, rank ${l.performanceRank}`);
    }
  });

  test('cuda-ipc info prints the peer table, and --json has one entry per directed pair', () => {
    const n = Device.all().length;
    const json = spawnSync(process.execPath, [cli, 'info', '--json'], { encoding: 'utf8' });
    assert.equal(json.status, 0, json.stderr);
    const report = JSON.parse(json.stdout);
    assert.equal(report.peers.length, n * (n - 1));
    for (const p of report.peers) assert.deepEqual(Object.keys(p).sort(), ['accessSupported', 'from', 'fromUuid', 'nativeAtomics', 'performanceRank', 'to', 'toUuid']);
    const text = spawnSync(process.execPath, [cli, 'info'], { encoding: 'utf8' });
    assert.equal(text.status, 0, text.stderr);
    assert.match(text.stdout, n === 1 ? /Peer links: none \(1 device; peer IPC needs two GPUs\)/ : /Peer links \(kernels on "from" using memory of "to"\):\n {2}from {2}to {2}access/);
  });

  test('spawn({ device: GPU 0 }): the child\'s kernels read and write a pool buffer and a legacy buffer of GPU 0', async () => {
    const d0 = Device.get(0);
    await kernelInChild(d0, d0);
  });

  test('a child whose CUDA_VISIBLE_DEVICES names GPU 0 by UUID works on it by UUID', async () => {
    const d0 = Device.get(0);
    await withChild({ device: d0, env: { ...process.env, CUDA_VISIBLE_DEVICES: d0.uuid } }, async (link) => {
      assert.deepEqual(await ask(link, { op: 'whoami' }), { ok: true, working: d0.uuid, workingOrdinal: 0, visible: [d0.uuid] });
    });
  });

  test('a GPU this process cannot see: setWorkingDevice and a child told to work on it refuse with ERR_UNKNOWN_DEVICE', async () => {
    const before = workingDevice();
    assert.throws(() => setWorkingDevice(NO_SUCH_GPU), (e: unknown) => e instanceof IpcError && e.code === 'ERR_UNKNOWN_DEVICE' && e.message.includes(NO_SUCH_GPU));
    assert.equal(workingDevice(), before, 'a refused choice changes nothing');
    using pool = Device.get(0).createIpcPool();
    using buffer = pool.allocate(4096);
    await withChild({ device: NO_SUCH_GPU }, async (link) => {
      const who = await ask(link, { op: 'whoami' });
      assert.equal(who.code, 'ERR_UNKNOWN_DEVICE');
      assert.match(who.message, /told to work on GPU GPU-00000000-1111-2222-3333-444444444444 \(CUDA_IPC_DEVICE, set by its parent's spawn\(\{ device \}\)\)/);
      const r = await ask(link, { op: 'kernel', buffers: [buffer], seed: 0, scale: 1 });
      assert.equal(r.code, 'ERR_UNKNOWN_DEVICE', 'the import is refused, the link stays up');
      assert.equal((await ask(link, { op: 'env' })).device, NO_SUCH_GPU);
    });
  });

  test('setWorkingDevice(GPU 0) in this process; an own pool is accessible from its own device', () => {
    const d0 = Device.get(0);
    const before = workingDevice();
    try {
      setWorkingDevice(d0.uuid.toUpperCase().replace('GPU-', 'gpu-'));
      assert.equal(workingDevice(), d0);
      using b = DeviceBuffer.allocate(64);
      assert.equal(b.device, d0);
      assert.equal(b.residentDevice, d0);
    } finally {
      setWorkingDevice(before);
    }
    using pool = d0.createIpcPool();
    assert.equal(pool.accessibleFrom(d0), true);
    pool.grantAccess(d0); // its own device: nothing to do
  });

  test('children on GPU 0 SIGKILLed holding GPU 0 memory: nothing leaks', async () => {
    const d0 = Device.get(0);
    await killedConsumers(d0, d0, 6);
  });

  test('a producer child on GPU 0 SIGKILLed: its buffer, mapped through setLinkWorkingDevice, stays readable; then freed', async () => {
    const d0 = Device.get(0);
    await killedProducer(d0, d0, true);
  });
});

describe('peer IPC across two GPUs', { skip: noPeerPair }, () => {
  test('the pair 0 -> 1 as cuDeviceGetP2PAttribute and `cuda-ipc info --json` report it', (t) => {
    const [d0, d1] = Device.all() as [Device, Device];
    const attrs = d1.peerAttributes(d0);
    assert.equal(attrs.accessSupported, true, 'cuDeviceCanAccessPeer said yes');
    const report = JSON.parse(spawnSync(process.execPath, [cli, 'info', '--json'], { encoding: 'utf8' }).stdout);
    const row = report.peers.find((p: any) => p.from === 1 && p.to === 0);
    assert.deepEqual(row, { from: 1, to: 0, fromUuid: d1.uuid, toUuid: d0.uuid, ...attrs });
    t.diagnostic(`1 -> 0: ${JSON.stringify(attrs)}; 0 -> 1: ${JSON.stringify(d0.peerAttributes(d1))}`);
  });

  test('a pool buffer and a legacy buffer of GPU 0, read and written by a kernel on GPU 1 in another process', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    await kernelInChild(d0, d1);
  });

  test('the same the other way: memory of GPU 1, kernels on GPU 0', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    await kernelInChild(d1, d0);
  });

  test('a child that lists the GPUs in the other order (CUDA_VISIBLE_DEVICES): the same GPUs by UUID, both ways', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    const env = { ...process.env, CUDA_VISIBLE_DEVICES: `${d1.uuid},${d0.uuid}` };
    await kernelInChild(d0, d1, { env });
    await withChild({ device: d1, env }, async (link) => {
      assert.deepEqual(await ask(link, { op: 'whoami' }), { ok: true, working: d1.uuid, workingOrdinal: 0, visible: [d1.uuid, d0.uuid] });
      using pool = d0.createIpcPool();
      using a = pool.allocate(4096);
      a.write(u32Pattern(3, 1024));
      const r = await ask(link, { op: 'kernel', buffers: [a], seed: 3, scale: 1 });
      assert.deepEqual({ deviceOrdinal: r.buffers[0].deviceOrdinal, residentOrdinal: r.buffers[0].residentOrdinal }, { deviceOrdinal: 0, residentOrdinal: 1 },
        'in the child, its GPU 1 is ordinal 0 and our GPU 0 is ordinal 1');
      // And back: memory the child allocated on its ordinal 0 is our GPU 1.
      const back = await ask(link, { op: 'allocate', bytes: 4096, seed: 77 });
      const buffer = back.buffer as DeviceBuffer;
      assert.equal(back.device, d1.uuid);
      assert.equal(buffer.residentDevice, d1);
      const got = new Uint32Array(1024);
      buffer.read(got);
      assert.deepEqual(got, u32Pattern(77, 1024));
      buffer.close();
    });
  });

  test('in one process: a GPU 0 allocation opened for GPU 1 (peer access), and an own pool granted to GPU 1', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    const n = 4096;
    using b = DeviceBuffer.allocate(n * 4, { device: d0 });
    b.write(u32Pattern(7, n));
    using v = openIpcHandle(b.ipcHandle(), { device: d1 });
    assert.equal(v.device, d1);
    assert.equal(v.residentDevice, d0);
    assert.equal(v.devicePointer, b.devicePointer);
    assert.equal(v.ipcHandle().deviceUuid, d0.uuid, 'a descriptor names the GPU the memory lives on');
    using stream = Stream.create(d1);
    const kernels = BuiltinKernels.for(d1);
    kernels.scale(v, 'u32', 5, stream);
    using pool = d0.createIpcPool();
    using p = pool.allocate(n * 4);
    p.write(u32Pattern(9, n));
    pool.grantAccess(d1);
    assert.equal(pool.accessibleFrom(d1), true);
    kernels.kernel('scale_u32').launch({ grid: 16, block: 256, stream }, [arg.ptr(p.devicePointer), arg.u64(BigInt(n)), arg.u32(2)]);
    await stream.synchronize();
    const got = new Uint32Array(n);
    b.read(got);
    assert.deepEqual(got, scaled(7, n, 5));
    p.read(got);
    assert.deepEqual(got, scaled(9, n, 2));
  });

  test('children on GPU 1 SIGKILLed holding GPU 0 memory: nothing leaks on either GPU', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    await killedConsumers(d0, d1, 10);
  });

  test('a producer on GPU 1 SIGKILLed: GPU 0 closes its import of the buffer (not read: CUDA frees it across GPUs) and GPU 1 gets the memory back', async () => {
    const [d0, d1] = Device.all() as [Device, Device];
    await killedProducer(d0, d1, false);
  });
});
