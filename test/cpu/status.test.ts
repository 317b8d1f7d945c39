// `cuda-ipc status` and `top` across processes: records appear with the right leases and peers,
// a SIGKILLed process disappears from the next snapshot with nobody cleaning up, a clean exit
// removes its own record, and `top` draws in a real pseudo-terminal and quits on q.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ProcessStatus, StatusSnapshot } from '../../src/observe/reader.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const PEER = fileURLToPath(new URL('../fixtures/status-peer.js', import.meta.url));
const PTY_RUN = fileURLToPath(new URL('../../../test/python/pty_run.py', import.meta.url));

// Every process of these tests (this one included) keeps its socket directory and records here.
const runtime = mkdtempSync(join(tmpdir(), 'cuda-ipc-status-'));
process.env.XDG_RUNTIME_DIR = runtime;
const records = join(runtime, `cuda-ipc-${process.getuid!()}`, 'status');
const env = { ...process.env, XDG_RUNTIME_DIR: runtime };
after(() => rmSync(runtime, { recursive: true, force: true }));

class Peer {
  readonly proc: ChildProcess;
  readonly #lines: AsyncIterator<string>;
  constructor(args: string[], extraEnv: NodeJS.ProcessEnv = {}) {
    this.proc = spawn(process.execPath, [PEER, ...args], { stdio: ['pipe', 'pipe', 'inherit'], env: { ...env, ...extraEnv } });
    this.#lines = createInterface({ input: this.proc.stdout! })[Symbol.asyncIterator]();
  }
  async next(): Promise<Record<string, unknown>> {
    const r = await this.#lines.next();
    if (r.done) throw new Error(`peer ${this.proc.pid} exited before saying more`);
    return JSON.parse(r.value) as Record<string, unknown>;
  }
  get pid(): number {
    return this.proc.pid!;
  }
  async exit(): Promise<number | null> {
    if (this.proc.exitCode !== null) return this.proc.exitCode;
    this.proc.stdin!.write('exit\n');
    const [code] = await once(this.proc, 'exit');
    return code as number | null;
  }
  kill(): void {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
  }
}

/** Two unrelated processes (listen/connect) that lent each other a host buffer. */
async function startPair(name: string, aBytes: number, bBytes: number): Promise<[Peer, Peer]> {
  const a = new Peer(['listen', name, String(aBytes)]);
  assert.deepEqual(await a.next(), { listening: true });
  const b = new Peer(['connect', name, String(bBytes)]);
  const [ra, rb] = await Promise.all([a.next(), b.next()]);
  assert.equal(ra.ready, true);
  assert.equal(rb.ready, true);
  assert.equal(ra.peerPid, b.pid);
  assert.equal(rb.peerPid, a.pid);
  return [a, b];
}

function statusJson(): StatusSnapshot {
  const r = spawnSync(process.execPath, [cli, 'status', '--json'], { encoding: 'utf8', env });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as StatusSnapshot;
}

/** Takes snapshots until `ok` holds for one (records are rewritten within ~250 ms of a change). */
async function until(what: string, ok: (s: StatusSnapshot) => boolean): Promise<StatusSnapshot> {
  const deadline = Date.now() + 10_000;
  let s = statusJson();
  while (!ok(s)) {
    if (Date.now() > deadline) assert.fail(`status never showed ${what}; last snapshot: ${JSON.stringify(s, null, 2)}`);
    await sleep(50);
    s = statusJson();
  }
  return s;
}

const proc = (s: StatusSnapshot, pid: number): ProcessStatus | undefined => s.processes.find((p) => p.pid === pid);

/** This process's own record, as a reader sees it now. */
const mine = async () => (await import('../../src/observe/reader.js')).collectStatus({ directory: records }).processes.find((p) => p.pid === process.pid);

/** Polls this process's record until `ok` (the publisher writes a few times a second). */
async function waitForMine(what: string, ok: (p: ProcessStatus | undefined) => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (let p = await mine(); !ok(p); p = await mine()) {
    if (Date.now() > deadline) assert.fail(`this process's record never showed ${what}: ${JSON.stringify(p)}`);
    await sleep(25);
  }
}

test('two processes leasing host buffers to each other: bytes and peers in status --json, then one is SIGKILLed', async () => {
  const [a, b] = await startPair('status-pair', 1 << 20, 256 << 10);
  try {
    const leased = (s: StatusSnapshot) => {
      const pa = proc(s, a.pid);
      const pb = proc(s, b.pid);
      return pa?.leasedTo.length === 1 && pb?.leasedTo.length === 1 && pa.importedFrom.length === 1 && pb.importedFrom.length === 1;
    };
    const s = await until('both leases', leased);
    const pa = proc(s, a.pid)!;
    const pb = proc(s, b.pid)!;
    assert.deepEqual(pa.leasedTo, [{ pid: b.pid, count: 1, bytes: 1 << 20 }]);
    assert.deepEqual(pb.leasedTo, [{ pid: a.pid, count: 1, bytes: 256 << 10 }]);
    assert.deepEqual(pa.importedFrom, [{ pid: b.pid, count: 1, bytes: 256 << 10 }]);
    assert.deepEqual(pb.importedFrom, [{ pid: a.pid, count: 1, bytes: 1 << 20 }]);
    assert.deepEqual(pa.leases, { count: 1, bytes: 1 << 20 });
    assert.deepEqual(pa.links.map((l) => [l.peerPid, l.state]), [[b.pid, 'open']]);
    assert.deepEqual(pb.links.map((l) => [l.peerPid, l.state]), [[a.pid, 'open']]);
    assert.equal(pa.device.allocations, 0);
    assert.match(pa.argv.join(' '), /status-peer\.js listen status-pair/);
    assert.ok(pa.openFds > 3, `open fds: ${pa.openFds}`);

    // The same in text, as a person reads it.
    const text = spawnSync(process.execPath, [cli, 'status'], { encoding: 'utf8', env });
    assert.equal(text.status, 0, text.stderr);
    assert.match(text.stdout, /2 processes using cuda-ipc/);
    assert.match(text.stdout, new RegExp(`pid ${a.pid}  node .*status-peer\\.js listen status-pair`));
    assert.match(text.stdout, new RegExp(`leased to +pid ${b.pid}: 1 lease, 1\\.0 MiB`));
    assert.match(text.stdout, new RegExp(`holds from +pid ${a.pid}: 1 lease, 1\\.0 MiB`));
    assert.match(text.stdout, new RegExp(`links +1 open: #1 pid ${a.pid} open`));

    // SIGKILL: no exit handler runs, its record stays behind until a reader sees the pid is gone.
    b.kill();
    await once(b.proc, 'exit');
    assert.ok(readdirSync(records).some((f) => f.startsWith(`${b.pid}-`)), 'the killed process could not remove its record');
    const gone = await until('the killed process gone and its leases ended', (s) => !proc(s, b.pid) && proc(s, a.pid)?.leasedTo.length === 0);
    const after = proc(gone, a.pid)!;
    assert.deepEqual(after.importedFrom, []);
    assert.deepEqual(after.links, []);
    assert.equal(readdirSync(records).some((f) => f.startsWith(`${b.pid}-`)), false, 'the reader removed the stale record');
    assert.deepEqual(await a.next(), { linkClosed: true }, "the survivor saw its link close");
  } finally {
    a.kill();
    b.kill();
  }
});

test('a process that exits normally removes its own record', async () => {
  const [a, b] = await startPair('status-exit', 4096, 4096);
  try {
    await until('both processes', (s) => !!proc(s, a.pid) && !!proc(s, b.pid));
    assert.equal(await b.exit(), 0, 'exits on its own once its link is closed');
    assert.equal(await a.exit(), 0);
    assert.deepEqual(readdirSync(records).filter((f) => f.startsWith(`${a.pid}-`) || f.startsWith(`${b.pid}-`)), []);
    const s = statusJson();
    assert.deepEqual(s.stale, [], 'nothing was left for a reader to clean up');
  } finally {
    a.kill();
    b.kill();
  }
});

test('publishing never keeps a process alive, even while it samples a channel; a new publisher sweeps dead records', () => {
  // A record left by a killed process (no process started at tick 1 has this pid now).
  const dead = spawnSync(process.execPath, ['-e', '']).pid;
  const leftover = join(records, `${dead}-1.json`);
  writeFileSync(leftover, '{}');
  const hooks = new URL('../../src/observe/hooks.js', import.meta.url).href;
  const script = `import { registerChannel } from ${JSON.stringify(hooks)};
    import { readdirSync } from 'node:fs';
    registerChannel({ snapshot: () => ({ id: 'c', role: 'none', memory: 'host', slotBytes: 1, slots: { free: 1, published: 0, taken: 0 }, peers: [] }) });
    // Long enough for the record to be written and sampled; then nothing is left to do.
    setTimeout(() => console.log(readdirSync(${JSON.stringify(records)}).some((f) => f.startsWith(process.pid + '-'))), 700);`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', env, timeout: 10_000 });
  assert.equal(r.signal, null, 'it had to be killed: something kept it alive');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stderr, '', 'no warning');
  assert.equal(r.stdout.trim(), 'true', 'it had published its record');
  assert.deepEqual(readdirSync(records).filter((f) => f.startsWith(`${r.pid}-`)), [], 'its record went with it');
  assert.equal(existsSync(leftover), false, 'it removed the dead process\'s record when it started publishing');
});

test('CUDA_IPC_STATUS=0 turns publishing off', async () => {
  const a = new Peer(['listen', 'status-off', '4096'], { CUDA_IPC_STATUS: '0' });
  assert.deepEqual(await a.next(), { listening: true });
  const b = new Peer(['connect', 'status-off', '4096'], { CUDA_IPC_STATUS: '0' });
  try {
    await Promise.all([a.next(), b.next()]);
    await sleep(400); // longer than a record takes to appear
    const s = statusJson();
    assert.equal(proc(s, a.pid), undefined);
    assert.equal(proc(s, b.pid), undefined);
  } finally {
    a.kill();
    b.kill();
  }
});

test('channels register a snapshot source: slot states and peers are sampled, unregister removes them', async () => {
  const { registerChannel } = await import('../../src/observe/hooks.js');
  const slots = { free: 8, writing: 0, published: 0, taken: 0 };
  let snapshots = 0;
  const source = {
    snapshot() {
      snapshots++;
      return {
        id: 'fake-1', role: 'producer' as const, topology: 'queue', memory: 'host' as const, slotBytes: 4096,
        slots: { ...slots }, peers: [{ pid: 4242, role: 'consumer' as const, state: 'live' }],
      };
    },
  };
  const registration = registerChannel(source);
  await waitForMine('the channel', (p) => p?.channels.length === 1);
  assert.deepEqual((await mine())!.channels[0], source.snapshot());
  // Slot states change with every message and are not pushed: the publisher samples them.
  slots.free = 5;
  slots.published = 2;
  slots.taken = 1;
  await waitForMine('the sampled slot states', (p) => p?.channels[0]?.slots.published === 2);
  assert.deepEqual((await mine())!.channels[0]!.slots, { free: 5, writing: 0, published: 2, taken: 1 });
  const text = spawnSync(process.execPath, [cli, 'status'], { encoding: 'utf8', env });
  assert.match(text.stdout, /channel +fake-1: producer, queue, host memory, 8 x 4\.0 KiB: 5 free, 0 writing, 2 published, 1 taken/);
  assert.match(text.stdout, /peers: pid 4242 consumer live/);
  registration.unregister();
  await waitForMine('no channel', (p) => p?.channels.length === 0);
  const calls = snapshots;
  await sleep(700);
  assert.equal(snapshots, calls, 'no sampling once no channel is registered');
});

test('top draws in a pseudo-terminal, refreshes, and quits on q with the terminal restored', async (t) => {
  const py = spawnSync('python3', ['-c', 'import pty, termios'], { encoding: 'utf8' });
  if (py.error || py.status !== 0) {
    t.skip(`python3 with pty is not available: ${py.error?.message ?? py.stderr}`);
    return;
  }
  const [a, b] = await startPair('status-top', 1 << 20, 1 << 20);
  try {
    await until('the pair', (s) => proc(s, a.pid)?.leasedTo.length === 1 && proc(s, b.pid)?.leasedTo.length === 1);
    const r = spawnSync('python3', [PTY_RUN, '--expect', `pid ${b.pid}`, '--keys', 'q', '--timeout', '20', '--',
      process.execPath, cli, 'top', '--interval', '0.2'], { encoding: 'utf8', env });
    assert.equal(r.status, 0, r.stderr);
    const run = JSON.parse(r.stdout) as { sawExpected: boolean; exitCode: number | null; timedOut: boolean; terminalRestored: boolean | null; output: string };
    assert.equal(run.sawExpected, true, `top never showed pid ${b.pid}: ${JSON.stringify(run.output)}`);
    assert.equal(run.timedOut, false, 'top did not quit on q');
    assert.equal(run.exitCode, 0);
    assert.match(run.output, /cuda-ipc top .* q quits/);
    assert.match(run.output, new RegExp(`leased to +pid ${b.pid}: 1 lease, 1\\.0 MiB`));
    assert.ok(run.output.includes('\x1b[?1049h') && run.output.endsWith('\x1b[?1049l'), 'takes the alternate screen and gives it back');
    assert.equal(run.terminalRestored, true, 'echo and line mode are back on');
  } finally {
    a.kill();
    b.kill();
  }
});

test('top without a terminal prints one snapshot per interval and stops after --iterations', async () => {
  const r = spawnSync(process.execPath, [cli, 'top', '--interval', '0.05', '--iterations', '3'], { encoding: 'utf8', env, timeout: 10_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.match(/^cuda-ipc top /gm)?.length, 3);
  assert.equal(r.stdout.includes('\x1b['), false, 'no terminal escapes into a file');
});

test('status on a directory with no records says so', () => {
  const empty = mkdtempSync(join(tmpdir(), 'cuda-ipc-status-empty-'));
  try {
    const r = spawnSync(process.execPath, [cli, 'status', '--dir', empty], { encoding: 'utf8', env });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /No process of this user publishes a cuda-ipc status record/);
    assert.ok(existsSync(empty));
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});

test('a real channel appears with its slot states and members, and disappears when closed', async () => {
  const { ChannelHub } = await import('../../src/channel/index.js');
  const hub = ChannelHub.create({ slots: 4, slotBytes: 64 });
  const producer = hub.producer();
  const consumer = hub.consumer();
  for (let i = 0; i < 3; i++) producer.publish(await producer.acquire(), { length: 1 });
  const taken = await consumer.receive();
  await waitForMine('both ends with 2 published and 1 taken', (p) => p?.channels.length === 2 && p.channels.every((c) => c.slots.published === 2 && c.slots.taken === 1));
  const rows = (await mine())!.channels;
  assert.deepEqual(rows.map((c) => c.role).sort(), ['consumer', 'producer']);
  for (const c of rows) {
    assert.equal(c.memory, 'host');
    assert.equal(c.slotBytes, 64);
    assert.deepEqual(c.slots, { free: 1, writing: 0, published: 2, taken: 1 });
    assert.equal(c.id, `hub pid ${process.pid}`);
    assert.deepEqual(c.peers.map((m) => `${m.pid} ${m.role} ${m.state}`).sort(), [`${process.pid} consumer live`, `${process.pid} producer live`]);
  }
  taken!.release();
  producer.close();
  consumer.close();
  hub.close();
  await waitForMine('no channel', (p) => (p?.channels.length ?? 0) === 0);
});
