// The CLI on a GPU: info, and the two-terminal producer/consumer flow as two processes.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { driver } from '../../src/cuda/driver.js';
import { asOwnHost, ncclOrReason } from '../helpers/nccl-ranks.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

/** Runs the CLI; `onOut` sees its standard output so far after each chunk. */
function run(args: string[], env: NodeJS.ProcessEnv = process.env, onOut?: (out: string) => void): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; onOut?.(out); });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => resolve({ code, out, err }));
  });
}

describe('cli on a GPU', { skip: noGpu }, () => {
  test('info prints the device table and JSON', () => {
    const r = spawnSync(process.execPath, [cli, 'info'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /Device 0: /);
    assert.match(r.stdout, /UUID\s+GPU-[0-9a-f]{8}-/);
    assert.match(r.stdout, /POSIX-fd pool handles\s+(yes|no)/);
    const j = spawnSync(process.execPath, [cli, 'info', '--json'], { encoding: 'utf8' });
    const report = JSON.parse(j.stdout);
    assert.ok(report.devices.length >= 1);
    assert.equal(report.error, null);
    assert.ok(report.devices[0].freeMemory > 0);
  });

  test('produce and consume in two processes, consumer started first', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'two-terminals-'));
    try {
      const file = join(dir, 'handle.json');
      let waiting!: () => void;
      const saysWaiting = new Promise<void>((resolve) => { waiting = resolve; });
      const consumer = run(['consume', file, '--timeout', '60'], process.env, (out) => { if (/consume: waiting up to 60 s for /.test(out)) waiting(); });
      // The producer starts once the consumer said it waits for the file (or exited: its output says why).
      await Promise.race([saysWaiting, consumer]);
      const producer = run(['produce', '--out', file, '--elements', '1000000', '--timeout', '60']);
      const [c, p] = await Promise.all([consumer, producer]);
      assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
      assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
      assert.match(c.out, /verified every element and doubled them: 1, 3, 5, 7, 9/);
      assert.match(p.out, /doubled every value: 1, 3, 5, 7, 9, \.\.\. OK/);
      assert.equal(existsSync(file), false, 'the producer removes its files');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a consumer with no producer times out with a clear message', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'two-terminals-'));
    try {
      const r = await run(['consume', join(dir, 'nothing.json'), '--timeout', '0.5']);
      assert.equal(r.code, 1);
      assert.match(r.err, /ERR_TIMEOUT.*start the producer first/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

type Exit = { code: number | null; out: string; err: string };

/**
 * Starts `produce --listen tcp://127.0.0.1:0 ARGS` and resolves once it printed its address; a
 * producer that exits before that rejects with what it printed (never a hang).
 */
function startProducer(args: string[], env: NodeJS.ProcessEnv): Promise<{ url: string; done: Promise<Exit> }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [cli, 'produce', '--listen', 'tcp://127.0.0.1:0', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
    let out = '';
    let err = '';
    let url: string | undefined;
    const done = new Promise<Exit>((r) => p.on('exit', (code) => r({ code, out, err })));
    p.stdout.on('data', (d) => {
      out += d;
      const m = /listening at (tcp:\/\/127\.0\.0\.1:\d+);/.exec(out);
      if (m && !url) {
        url = m[1]!;
        resolve({ url, done });
      }
    });
    p.stderr.on('data', (d) => { err += d; });
    void done.then((e) => { if (!url) reject(new Error(`the producer exited (${e.code}) before it listened:\n${e.out}${e.err}`)); });
  });
}

const twoGpus = noGpu ?? (driver.deviceGetCount() < 2 ? 'needs two GPUs (NCCL takes one GPU per process)' : undefined);

describe('cli across machines on two GPUs', { skip: twoGpus }, () => {
  test('produce --listen and consume tcp:// move a device array over NCCL both ways, each side\'s values checked', async () => {
    const env = { ...process.env, CUDA_IPC_TOKEN: 'a token for the cli test, 32 b.', NCCL_NVLS_ENABLE: '0' };
    const { url, done: producerDone } = await startProducer(['--device', '0', '--elements', '4000000', '--timeout', '120'], env);
    const c = await run(['consume', url, '--device', '1', '--timeout', '120'], env);
    const p = await producerDone;
    assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
    assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
    assert.match(c.out, /received 4000000 float32 over NCCL into device 1: 0\.5, 1\.5/);
    assert.match(p.out, /doubled its copy on its GPU and sent it back: 1, 3, 5, 7, 9, \.\.\.; this side's array is unchanged\. OK/);
    assert.match(p.out, /moved 16000000 bytes out and 16000000 bytes in over NCCL/);
  });
});

const nccl = noGpu ?? (await ncclOrReason().then((n) => (typeof n === 'string' ? n : undefined)));

describe('cli across machines on one GPU, each side its own NCCL host (the network path)', { skip: nccl }, () => {
  test('produce --listen and consume tcp:// move a device array over NCCL\'s sockets both ways, each side\'s values checked', async () => {
    const env = { ...process.env, CUDA_IPC_TOKEN: 'a token for the cli test, 32 b.', NCCL_NVLS_ENABLE: '0' };
    const { url, done: producerDone } = await startProducer(['--device', '0', '--elements', '4000000', '--timeout', '120'], { ...env, ...asOwnHost('producer') });
    const c = await run(['consume', url, '--device', '0', '--timeout', '120'], { ...env, ...asOwnHost('consumer') });
    const p = await producerDone;
    assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
    assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
    assert.match(c.out, /received 4000000 float32 over NCCL into device 0: 0\.5, 1\.5/);
    assert.match(p.out, /moved 16000000 bytes out and 16000000 bytes in over NCCL/);
  });
});

describe('cli across machines, both sides on one GPU (issue 39.13)', { skip: nccl }, () => {
  test('the consumer\'s NCCL failure reaches the producer: both terminals print the same cause', async () => {
    const env = { ...process.env, CUDA_IPC_TOKEN: 'a token for the cli test, 32 b.', NCCL_NVLS_ENABLE: '0' };
    const { url, done: producerDone } = await startProducer(['--device', '0', '--elements', '1000', '--timeout', '120'], env);
    // The consumer's device from CUDA_IPC_DEVICE (the default of --device): the producer's GPU, which NCCL refuses.
    const c = await run(['consume', url, '--timeout', '120'], { ...env, CUDA_IPC_DEVICE: '0' });
    const p = await producerDone;
    assert.equal(c.code, 1, `consumer: ${c.out}${c.err}`);
    assert.equal(p.code, 1, `producer: ${p.out}${p.err}`);
    const cause = /cuda-ipc consume: \[(\w+)\] (.*)$/m.exec(c.err);
    assert.ok(cause, c.err);
    assert.match(cause[1]!, /^ERR_NCCL/);
    assert.ok(p.err.includes(`the consumer failed: [${cause[1]}] ${cause[2]}`), `the producer printed the consumer's cause:\n${p.err}`);
    assert.doesNotMatch(p.err, /closed the link/);
  });
});
