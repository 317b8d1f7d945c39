// Issue 39, points 1, 2, 3, 8 and 13, as a new user meets them: produce --out never writes over
// or deletes what it did not make (a regular file, a FIFO, a symlink stay as they were: content,
// inode, link target); --force replaces only a regular file of the user's; the library's file
// writes keep the same rule; durations past what a timer holds exit 2 naming the bound; consume
// on the descriptor of a SIGKILLed producer ends at once with that cause; CUDA_IPC_DEVICE is the
// default of --device, checked as the flag is; a producer that fails after the link opened tells
// the consumer why, so both print the same cause.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, unlinkSync, writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { removeIfSame, writeFileAtomic, identityOf } from '../../src/safe-files.js';
import { whyNoGpu } from '../../src/cli/availability.js';
import { connect } from '../../src/link/index.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cli-files-'));
const children: ChildProcess[] = [];
after(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});
const TOKEN = 'cli-files-token-0123456789';
const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({ ...process.env, XDG_RUNTIME_DIR: dir, CUDA_IPC_DEVICE: '', ...extra });
const noGpu = whyNoGpu(0);

interface Run { code: number | null; signal: NodeJS.Signals | null; out: string; err: string }

/**
 * Runs the CLI; `onLine` sees each stdout line as it comes. A command that hangs is killed after
 * two minutes, which fails the test that expected it to end by itself (`signal` is then set).
 */
function run(args: string[], extraEnv: NodeJS.ProcessEnv = {}, onLine?: (line: string, child: ChildProcess) => void): Promise<Run> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: env(extraEnv) });
    children.push(p);
    let out = '';
    let err = '';
    const hung = setTimeout(() => p.kill('SIGKILL'), 120_000);
    createInterface({ input: p.stdout! }).on('line', (l) => {
      out += `${l}\n`;
      onLine?.(l, p);
    });
    p.stderr!.on('data', (d) => { err += d; });
    p.on('exit', (code, signal) => {
      clearTimeout(hung);
      setImmediate(() => resolve({ code, signal, out, err }));
    });
  });
}

/** What is in `d`, to check that nothing was added or left behind. */
const listing = (d: string): string[] => readdirSync(d).sort();

test('produce --out onto an existing regular file, FIFO or symlink exits 2 and changes nothing of the user\'s, --force included', async () => {
  const d = mkdtempSync(join(dir, 'out-'));
  const precious = join(d, 'precious.txt');
  writeFileSync(precious, 'precious\n');
  const fifo = join(d, 'fifo');
  assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
  const link = join(d, 'link.json');
  symlinkSync(precious, link);
  const before = { file: identityOf(statSync(precious)), fifo: identityOf(lstatSync(fifo)), link: identityOf(lstatSync(link)) };
  const names = listing(d);
  const cases: Array<[string, string[], RegExp]> = [
    ['a regular file', [precious], /--out .*precious\.txt already holds a regular file of 9 bytes \(yours\); cuda-ipc writes only new files .*add --force to replace a regular file of your own/],
    ['a FIFO', [fifo], /--out .*fifo already holds a FIFO \(yours\)/],
    ['a FIFO, --force', [fifo, '--force'], /--out .*fifo already holds a FIFO \(yours\), which is never replaced: --force replaces only a regular file of your own/],
    ['a symlink', [link], /--out .*link\.json already holds a symbolic link \(yours\)/],
    ['a symlink, --force', [link, '--force'], /--out .*link\.json already holds a symbolic link \(yours\), which is never replaced/],
  ];
  for (const [what, [out, ...more], expect] of cases) {
    const r = await run(['produce', '--out', out!, '--elements', '16', '--timeout', '600', ...more]);
    assert.equal(r.signal, null, `${what}: ended by itself`);
    assert.equal(r.code, 2, `${what}: ${r.out}${r.err}`);
    assert.match(r.err, expect, what);
    assert.equal(r.out, '', `${what}: refused before anything was allocated or written`);
  }
  assert.equal(readFileSync(precious, 'utf8'), 'precious\n');
  assert.deepEqual(identityOf(statSync(precious)), before.file, 'the same file, not a copy');
  assert.ok(lstatSync(fifo).isFIFO());
  assert.deepEqual(identityOf(lstatSync(fifo)), before.fifo);
  assert.ok(lstatSync(link).isSymbolicLink());
  assert.equal(readlinkSync(link), precious);
  assert.deepEqual(identityOf(lstatSync(link)), before.link);
  assert.deepEqual(listing(d), names, 'no temporary, no report left behind');
});

test('a report name FILE.done already there: produce exits 2 naming it; --force removes a regular file of the user\'s there and runs', async () => {
  const d = mkdtempSync(join(dir, 'done-'));
  const out = join(d, 'handle.json');
  writeFileSync(`${out}.done`, '{"ok":true,"pid":1}\n');
  const r = await run(['produce', '--out', out, '--elements', '16', '--timeout', '600']);
  assert.equal(r.code, 2, r.out + r.err);
  assert.match(r.err, /the consumer's report name .*handle\.json\.done already holds a regular file of 20 bytes \(yours\)/);
  assert.equal(readFileSync(`${out}.done`, 'utf8'), '{"ok":true,"pid":1}\n');
  assert.equal(existsSync(out), false);
  // --force: the earlier report goes, the flow runs to the end, and the producer removes its own files.
  const flow = await twoTerminals(out, ['--force']);
  assert.equal(flow.consumer.code, 0, flow.consumer.out + flow.consumer.err);
  assert.equal(flow.producer.code, 0, flow.producer.out + flow.producer.err);
  assert.deepEqual(listing(d), []);
});

/** produce --out `out` and, once the descriptor is written, consume it; both results. */
async function twoTerminals(out: string, produceArgs: string[] = []): Promise<{ producer: Run; consumer: Run; descriptor: string }> {
  let consumer: Promise<Run> | undefined;
  let descriptor = '';
  const producer = await run(['produce', '--out', out, '--elements', '64', '--timeout', '600', ...produceArgs], {}, (line) => {
    if (!consumer && /^descriptor written/.test(line)) {
      descriptor = readFileSync(out, 'utf8');
      consumer = run(['consume', out, '--timeout', '600']);
    }
  });
  assert.ok(consumer, `the producer wrote no descriptor: ${producer.out}${producer.err}`);
  return { producer, consumer: await consumer, descriptor };
}

test('produce --out FILE --force replaces a regular file of the user\'s, and removes only what it wrote', async () => {
  const d = mkdtempSync(join(dir, 'force-'));
  const out = join(d, 'old.json');
  writeFileSync(out, 'an old descriptor\n');
  const flow = await twoTerminals(out, ['--force']);
  assert.equal(flow.producer.code, 0, flow.producer.out + flow.producer.err);
  assert.equal(flow.consumer.code, 0, flow.consumer.out + flow.consumer.err);
  assert.match(flow.descriptor, /"(memory|kind)"/, 'the descriptor replaced the old file');
  assert.deepEqual(listing(d), [], 'the producer removed its descriptor and the report it read, nothing else is there');
});

test('writeFileAtomic never writes over what it may not replace; removeIfSame removes only the file it names', () => {
  const d = mkdtempSync(join(dir, 'lib-'));
  const mine = join(d, 'mine');
  writeFileSync(mine, 'mine');
  const st = statSync(mine);
  assert.throws(() => writeFileAtomic(mine, 'new'), (e: Error & { code?: string }) => e.code === 'ERR_FILE_UNSAFE' && /already holds a regular file of 4 bytes \(yours\); it was left as it is/.test(e.message));
  assert.equal(readFileSync(mine, 'utf8'), 'mine');
  assert.deepEqual(identityOf(statSync(mine)), identityOf(st));
  const fifo = join(d, 'fifo');
  assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
  const link = join(d, 'link');
  symlinkSync(mine, link);
  for (const p of [fifo, link]) {
    assert.throws(() => writeFileAtomic(p, 'x', { replace: 'own-regular-file' }), (e: Error & { code?: string }) => e.code === 'ERR_FILE_UNSAFE' && /which is never replaced/.test(e.message));
  }
  assert.ok(lstatSync(fifo).isFIFO());
  assert.equal(readlinkSync(link), mine);
  assert.equal(readFileSync(mine, 'utf8'), 'mine');
  // A regular file of this user may be replaced when asked; the new file's identity is returned.
  const replaced = writeFileAtomic(mine, 'replaced', { replace: 'own-regular-file' });
  assert.equal(readFileSync(mine, 'utf8'), 'replaced');
  assert.deepEqual(identityOf(statSync(mine)), replaced);
  // By identity: only this process's own earlier version.
  const fresh = join(d, 'fresh');
  const first = writeFileAtomic(fresh, 'one');
  const second = writeFileAtomic(fresh, 'two', { replace: first });
  assert.equal(readFileSync(fresh, 'utf8'), 'two');
  assert.throws(() => writeFileAtomic(fresh, 'three', { replace: first }), /now holds a regular file of 3 bytes \(yours\) that this process did not write/);
  // Someone else's file under the name: not removed.
  unlinkSync(fresh);
  writeFileSync(fresh, 'theirs');
  assert.equal(removeIfSame(fresh, second), false);
  assert.equal(readFileSync(fresh, 'utf8'), 'theirs');
  assert.deepEqual(listing(d), ['fifo', 'fresh', 'link', 'mine'], 'no temporary left');
});

test('durations past what a timer holds exit 2 naming the bound, with no TimeoutOverflowWarning; the library refuses them too', async () => {
  const out = join(dir, 'never.json');
  const cases: string[][] = [
    ['produce', '--out', out, '--timeout', '3000000'],
    ['produce', '--out', out, '--timeout', '1e99'],
    ['produce', '--listen', 'tcp://127.0.0.1:0', '--timeout', '1e99'],
    ['consume', out, '--timeout', '3000000'],
    ['consume', 'tcp://127.0.0.1:1', '--timeout', '1e99'],
    ['top', '--interval', '1e99', '--iterations', '1'],
  ];
  for (const args of cases) {
    const r = await run(args, { CUDA_IPC_TOKEN: TOKEN });
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.out}${r.err}`);
    assert.match(r.err, /--(timeout|interval) \S+ is longer than a timer can wait: at most 2147483 seconds \(2\^31-1 ms, about 24\.8 days\)/, args.join(' '));
    assert.doesNotMatch(r.err, /TimeoutOverflowWarning/);
  }
  const ms = await run(['demo', 'events', '--ms', '9999999999']);
  assert.equal(ms.code, 2, ms.out + ms.err);
  assert.match(ms.err, /--ms 9999999999 is longer than a timer can wait: at most 2147483647 ms/);
  assert.equal(existsSync(out), false);
  await assert.rejects(connect('cli-files-nobody', { timeout: 2 ** 31 }), (e: Error & { code?: string }) => e.code === 'ERR_OUT_OF_RANGE' && /up to 2147483647/.test(e.message));
});

test('consume on the descriptor of a SIGKILLed producer ends at once with the stale cause, not at --timeout', async () => {
  const d = mkdtempSync(join(dir, 'stale-'));
  const out = join(d, 'stale.json');
  const killed = await run(['produce', '--out', out, '--elements', '16', '--timeout', '600'], {}, (line, child) => {
    if (/^descriptor written/.test(line)) child.kill('SIGKILL');
  });
  assert.equal(killed.signal, 'SIGKILL', killed.out + killed.err);
  assert.ok(existsSync(out), 'a killed producer leaves its descriptor');
  const host = JSON.parse(readFileSync(out, 'utf8')).memory === 'host';
  // --timeout 600 against run()'s two-minute guard: only ending by itself passes.
  const r = await run(['consume', out, '--timeout', '600']);
  assert.equal(r.signal, null, 'consume waited for a producer that is gone');
  assert.equal(r.code, 1, r.out + r.err);
  if (host) {
    assert.match(r.err, /\[ERR_NO_LISTENER\] could not reach the producer \(pid \d+\) on its link 'cuda-ipc-produce-\d+': no listener named .* is a stale socket left by a process that is gone\. .*stale\.json was left by a producer that ended without removing it \(no process \d+ runs now\): remove it and start `cuda-ipc produce --out .*stale\.json` again/);
  } else {
    assert.match(r.err, /\[ERR_HANDLE_STALE\] .*stale\.json describes memory of process \d+, which no longer runs/);
  }
  assert.doesNotMatch(r.out, /waiting up to/);
  assert.deepEqual(listing(d), ['stale.json'], 'consume wrote no report for a producer that is gone, and removed nothing');
});

test('CUDA_IPC_DEVICE is the default of --device, checked as the flag is', async () => {
  const out = join(dir, 'device.json');
  const bad = await run(['produce', '--out', out, '--timeout', '1'], { CUDA_IPC_DEVICE: 'abc' });
  assert.equal(bad.code, 2, bad.out + bad.err);
  assert.match(bad.err, /CUDA_IPC_DEVICE must be a device ordinal \(0, 1, \.\.\.\) or a device UUID \(GPU-\.\.\.\), got 'abc'; fix or unset it/);
  const far = await run(['roundtrip', '--elements', '16'], { CUDA_IPC_DEVICE: '99' });
  assert.equal(far.code, 2, far.out + far.err);
  if (noGpu !== undefined) {
    assert.match(far.err, /CUDA_IPC_DEVICE=99: there is no GPU here to choose \(.*\); unset CUDA_IPC_DEVICE to run the round trip on host shared memory/);
    const uuid = await run(['consume', 'tcp://127.0.0.1:1'], { CUDA_IPC_DEVICE: 'GPU-00000000-0000-0000-0000-000000000000', CUDA_IPC_TOKEN: TOKEN });
    assert.equal(uuid.code, 2, uuid.out + uuid.err);
    assert.match(uuid.err, /CUDA_IPC_DEVICE=GPU-00000000-0000-0000-0000-000000000000: there is no GPU here to choose/);
  } else {
    assert.match(far.err, /CUDA_IPC_DEVICE=99: there is no device 99; this machine has \d+/);
  }
  // The flag wins over the variable; an empty variable is unset.
  const flag = await run(['roundtrip', '--elements', '16', '--device', 'x'], { CUDA_IPC_DEVICE: '0' });
  assert.equal(flag.code, 2);
  assert.match(flag.err, /--device must be a device ordinal \(0, 1, \.\.\.\), got 'x'/);
  const empty = await run(['roundtrip', '--elements', '16'], { CUDA_IPC_DEVICE: '' });
  assert.equal(empty.code, 0, empty.out + empty.err);
  assert.equal(existsSync(out), false);
});

test('a producer that fails after the consumer connected tells it why: both terminals print the same cause', async () => {
  let url = '';
  let consumer: Promise<Run> | undefined;
  // 2^50 float32 (4 PiB): the allocation fails once a consumer is there to tell.
  const producer = await run(['produce', '--listen', 'tcp://127.0.0.1:0', '--elements', String(2 ** 50), '--timeout', '600'], { CUDA_IPC_TOKEN: TOKEN }, (line) => {
    const m = /^listening at (tcp:\/\/127\.0\.0\.1:\d+)/.exec(line);
    if (m && !consumer) {
      url = m[1]!;
      consumer = run(['consume', url, '--timeout', '600'], { CUDA_IPC_TOKEN: TOKEN });
    }
  });
  assert.ok(consumer, producer.out + producer.err);
  const c = await consumer;
  assert.equal(producer.code, 1, producer.out + producer.err);
  assert.equal(c.code, 1, c.out + c.err);
  const cause = /\[(ERR_\w+)\] (HostBuffer\.allocate: .*)$/m.exec(producer.err);
  assert.ok(cause, producer.err);
  assert.equal(cause[1], 'ERR_OUT_OF_MEMORY');
  assert.ok(c.err.includes(`[${cause[1]}] the producer at ${url} failed: ${cause[2]}`), `the consumer printed the producer's cause:\n${c.err}`);
  assert.doesNotMatch(c.err, /closed the link|ERR_LINK_CLOSED|ERR_PEER_GONE/);
});
