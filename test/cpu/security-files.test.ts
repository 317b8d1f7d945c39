// Issue 29, files, attacked by a second local user ('nobody') with root as the victim: symlinks
// planted at the names produce/consume write through; FIFOs, /dev/zero and huge files where they
// read; a status folder that is not the victim's, or holds hostile records (terminal escapes, a
// FIFO, /dev/zero, malformed JSON); a cuda_ipc.py planted in the working directory of spawnPython.
// Each held: nothing of the victim's changed, the attack was refused with a typed error (or
// contained: shown escaped, skipped and named), and no command hung. The table of attacks and what
// each got is printed as a diagnostic.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn as spawnProcess, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import {
  existsSync, lchownSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, truncateSync, unlinkSync, writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnPython } from '../../src/link/index.js';
import { processStartTime } from '../../src/observe/record.js';
import { addon } from '../../src/native/addon.js';
import { Secret, attackTable, noSecondUser, nobody, report, sharedDirectory } from '../helpers/attacker.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';
import { hasGpu } from '../helpers/gpu.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const skip = noSecondUser;
const dirs: string[] = [];
const sleepers: ChildProcess[] = [];
after(() => {
  for (const p of sleepers) p.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  if (!skip) console.log(`attacks on files (issue 29)\n${attackTable()}`);
});

function shared(mode: 0o1777 | 0o777): string {
  const d = sharedDirectory(mode);
  dirs.push(d);
  return d;
}
function privateDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'cuda-ipc-own-'));
  dirs.push(d);
  return d;
}
/** Makes `path` the attacker's (as if nobody had made it). */
const theirs = (path: string): void => lchownSync(path, nobody.uid, nobody.gid);
/** Any byte that could drive a terminal, in output meant for one (newlines between lines are fine). */
const RAW_CONTROL = /[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/;

interface Run { code: number | null; signal: string | null; out: string; err: string }

/** A CLI command as the victim; killed (and so failing the test) only if it hangs for a minute. */
function run(args: string[], env: NodeJS.ProcessEnv = process.env, onOut?: (text: string) => void): Promise<Run> {
  return new Promise((resolve) => {
    const p = spawnProcess(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
    let out = '';
    let err = '';
    const hung = setTimeout(() => p.kill('SIGKILL'), 60_000);
    p.stdout.on('data', (d) => { out += d; onOut?.(out); });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code, signal) => { clearTimeout(hung); resolve({ code, signal, out, err }); });
  });
}

/** A directory with its own private runtime directory, as XDG_RUNTIME_DIR. */
function runtimeEnv(): { env: NodeJS.ProcessEnv; runtime: string } {
  const runtime = privateDir();
  return { env: { ...process.env, XDG_RUNTIME_DIR: runtime }, runtime };
}

test('produce/consume in a shared directory: symlinks planted at the names they write through', { skip }, async () => {
  const dir = shared(0o1777);
  const secret = new Secret();
  const file = join(dir, 'handle.json');
  // The names the old code wrote through (FILE.tmp-<pid>, FILE.done.tmp-<pid>) for the pids to come,
  // and FILE itself, all symlinks to the victim's file, all the attacker's.
  const last = Number(readFileSync('/proc/sys/kernel/ns_last_pid', 'utf8'));
  const planted = [file];
  for (let pid = last + 1; pid <= last + 1500; pid++) planted.push(`${file}.tmp-${pid}`, `${file}.done.tmp-${pid}`);
  for (const p of planted) {
    symlinkSync(secret.path, p);
    theirs(p);
  }
  const { env } = runtimeEnv();
  // FILE itself taken by the attacker's symlink: produce never writes over it (issue 39.1), --force neither.
  for (const force of [[], ['--force']]) {
    const refused = await run(['produce', '--out', file, '--elements', '16', '--timeout', '60', ...force], env);
    assert.equal(refused.code, 2, refused.out + refused.err);
    assert.match(refused.err, new RegExp(`--out .*handle\\.json already holds a symbolic link \\(owned by uid ${nobody.uid}\\)`));
  }
  assert.ok(lstatSync(file).isSymbolicLink(), 'the attacker\'s name is left as it is');
  assert.equal(secret.state(), 'unchanged');
  unlinkSync(file); // the name is free again: the flow runs with the temporary names still planted
  let consumer: Promise<Run> | undefined;
  const producer = run(['produce', '--out', file, '--elements', '4096', '--timeout', '60'], env, (out) => {
    if (!consumer && /descriptor written/.test(out)) consumer = run(['consume', file, '--timeout', '60'], env);
  });
  const p = await producer;
  const c = await consumer!;
  assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
  assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
  assert.equal(secret.state(), 'unchanged');
  assert.equal(existsSync(file), false, 'the producer removed the descriptor it wrote');
  assert.ok(lstatSync(`${file}.tmp-${last + 1}`).isSymbolicLink(), 'what the attacker planted is not this process\'s to delete');
  report(`produce --out / consume in a sticky directory, ${planted.length} symlinks to the victim's file planted at FILE and the temp names`, 'FILE taken: exit 2, left as it is (--force too); FILE free: flow done (exit 0 both), temporaries are new O_EXCL names published by link()', `secret ${secret.state()}`);
});

test('consume and produce on a FIFO, /dev/zero, a huge file, a planted report: refused at once, nothing hangs', { skip }, async () => {
  const dir = shared(0o1777);
  const fifo = join(dir, 'fifo.json');
  assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
  theirs(fifo);
  const zero = join(dir, 'zero.json');
  symlinkSync('/dev/zero', zero);
  theirs(zero);
  const huge = join(dir, 'huge.json');
  writeFileSync(huge, '');
  truncateSync(huge, 300 * 2 ** 20);
  theirs(huge);
  const cases: Array<[string, string[], RegExp]> = [
    ['consume on a FIFO', ['consume', fifo, '--timeout', '2'], /\[ERR_FILE_UNSAFE\] .* is a FIFO, not a regular file/],
    ['consume on a symlink to /dev/zero', ['consume', zero, '--timeout', '2'], /\[ERR_FILE_UNSAFE\] .* is a device, not a regular file/],
    ['consume on a 300 MB file', ['consume', huge, '--timeout', '2'], /\[ERR_FILE_UNSAFE\] .* holds 314572800 bytes, more than the 1048576 it may/],
  ];
  // The producer's report name, FILE.done, planted as a FIFO before it starts.
  const out = join(dir, 'p.json');
  assert.equal(spawnSync('mkfifo', [`${out}.done`]).status, 0);
  theirs(`${out}.done`);
  const producer = await run(['produce', '--out', out, '--elements', '16', '--timeout', '2'], runtimeEnv().env);
  assert.equal(producer.code, 2, producer.out + producer.err);
  assert.match(producer.err, new RegExp(`the consumer's report name .*p\\.json\\.done already holds a FIFO \\(owned by uid ${nobody.uid}\\)`));
  assert.ok(lstatSync(`${out}.done`).isFIFO());
  report('produce with its report name planted as a FIFO', 'refused before anything is written (exit 2)', 'the FIFO left as it is');
  for (const [what, args, expect] of cases) {
    const r = await run(args, runtimeEnv().env);
    assert.equal(r.signal, null, `${what}: did not end by itself`);
    assert.equal(r.code, 1, `${what}: ${r.out}${r.err}`);
    assert.match(r.err, expect, what);
    report(what, (/\[(ERR_\w+)\]/.exec(r.err)?.[1] ?? '?') + ', exit 1 by itself', 'no read past the bound, no hang');
  }
});

test('consume of a SIGKILLed producer\'s descriptor ends at once with the stale socket as its cause (issues 28.5, 39.3)', async () => {
  const { env, runtime } = runtimeEnv();
  // What a killed producer leaves: its descriptor, and a socket file nobody listens on.
  const sockets = join(runtime, `cuda-ipc-${process.getuid!()}`);
  mkdirSync(sockets, { mode: 0o700 });
  const fd = addon.socket();
  addon.bind(fd, join(sockets, 'cuda-ipc-produce-999999.sock'));
  addon.close(fd);
  const file = join(runtime, 'stale.json');
  writeFileSync(file, JSON.stringify({ memory: 'host', link: 'cuda-ipc-produce-999999', dtype: 'float32', shape: [16], pid: 999999 }));
  // A timeout longer than run()'s one-minute guard: only ending at once passes.
  const r = await run(['consume', file, '--timeout', '600'], env);
  assert.equal(r.signal, null, 'consume waited for a producer that is gone');
  assert.equal(r.code, 1, r.out + r.err);
  assert.match(r.err, /\[ERR_NO_LISTENER\] could not reach the producer \(pid 999999\) on its link 'cuda-ipc-produce-999999': .*stale socket.* \(no process 999999 runs now\)/);
});

test('status with a runtime directory the attacker made, its status folder a symlink to the victim\'s folder', { skip }, async () => {
  const runtime = shared(0o1777);
  const victimDir = privateDir();
  const precious = join(victimDir, '123-456.json'); // a name the reader would sweep as a dead process's record
  writeFileSync(precious, 'the victim\'s file', { mode: 0o600 });
  const own = join(runtime, `cuda-ipc-${process.getuid!()}`);
  mkdirSync(own, { mode: 0o777 });
  theirs(own);
  symlinkSync(victimDir, join(own, 'status'));
  theirs(join(own, 'status'));
  for (const args of [['status'], ['status', '--json'], ['top', '--iterations', '1']]) {
    const r = await run(args, { ...process.env, XDG_RUNTIME_DIR: runtime });
    assert.equal(r.code, 1, r.out + r.err);
    assert.match(r.err, /\[ERR_SOCKET_DIR_UNSAFE\] the socket directory .* is not a private directory of this user/);
  }
  // The victim's own runtime directory, with its status folder a symlink (and an explicit --dir through one).
  const { env, runtime: mine } = runtimeEnv();
  mkdirSync(join(mine, `cuda-ipc-${process.getuid!()}`), { mode: 0o700 });
  symlinkSync(victimDir, join(mine, `cuda-ipc-${process.getuid!()}`, 'status'));
  const r = await run(['status'], env);
  assert.equal(r.code, 1, r.out + r.err);
  assert.match(r.err, /\[ERR_SOCKET_DIR_UNSAFE\] the status directory .* it is a symbolic link/);
  assert.equal(readFileSync(precious, 'utf8'), 'the victim\'s file', 'nothing outside the status folder is removed');
  report('status/top with the runtime directory pre-created by the attacker, status/ a symlink to the victim\'s folder', 'ERR_SOCKET_DIR_UNSAFE, exit 1; nothing read or removed', `${precious.split('/').pop()} kept`);
});

/** A live process to name a record after (records of dead pids are swept, not read). */
function liveProcess(): { pid: number; start: string } {
  const p = spawnProcess('sleep', ['120'], { stdio: 'ignore' });
  sleepers.push(p);
  return { pid: p.pid!, start: processStartTime(p.pid!)! };
}

function record(pid: number, start: string, argv: unknown[], extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    version: 1, pid, startTime: start, argv, updatedAt: Date.now(),
    device: { allocations: 0, allocatedBytes: 0, leased: 0, leasedBytes: 0, heldBytes: 0, imports: 0, importedBytes: 0 },
    leases: { count: 0, bytes: 0 }, links: [], channels: [],
    importCache: { mappings: 0, idle: 0, idleLimit: 0, references: 0, exports: 0, opened: 0 }, openFds: 3, ...extra,
  });
}

// Needs no second user: the records are planted in the victim's own folder (one made another uid's where root can).
test('status and top over hostile records in the victim\'s own folder: escaped, bounded, skipped and named', async () => {
  const { env, runtime } = runtimeEnv();
  const folder = join(runtime, `cuda-ipc-${process.getuid!()}`, 'status');
  mkdirSync(folder, { recursive: true, mode: 0o700 });
  const at = (p: { pid: number; start: string }) => join(folder, `${p.pid}-${p.start}.json`);
  const escapes = liveProcess();
  writeFileSync(at(escapes), record(escapes.pid, escapes.start, ['node', '\x1b]0;pwned\x07', '\x1b[2J\x1b[H', 'ok\r\nFAKE: pid 1 holds 9 GiB', '\u202eevil', '\x9b31m'], {
    channels: [{ id: '\x1b[31mred', role: 'producer', memory: 'host', slotBytes: 64, slots: { free: 1, published: 0, taken: 0 }, peers: [{ pid: 1, role: 'consumer', state: '\x07' }] }],
  }), { mode: 0o600 });
  const zero = liveProcess();
  symlinkSync('/dev/zero', at(zero));
  const fifo = liveProcess();
  assert.equal(spawnSync('mkfifo', [at(fifo)]).status, 0);
  const malformed = liveProcess();
  writeFileSync(at(malformed), JSON.stringify({ version: 1, pid: malformed.pid, startTime: malformed.start, links: [null], channels: [], argv: [1], updatedAt: 'x' }));
  const foreign = process.getuid!() === 0 ? liveProcess() : undefined;
  if (foreign) {
    writeFileSync(at(foreign), record(foreign.pid, foreign.start, ['theirs']));
    theirs(at(foreign));
  }
  const huge = liveProcess();
  writeFileSync(at(huge), '');
  truncateSync(at(huge), 32 * 2 ** 20);
  const notJson = liveProcess();
  writeFileSync(at(notJson), '\x1b]0;title\x07 not json');

  const text = await run(['status'], env);
  assert.equal(text.code, 0, text.out + text.err);
  assert.doesNotMatch(text.out, RAW_CONTROL);
  assert.match(text.out, new RegExp(`pid ${escapes.pid}  node \\\\e\\]0;pwned\\\\x07 \\\\e\\[2J\\\\e\\[H ok\\\\r\\\\nFAKE: pid 1 holds 9 GiB \\\\u202eevil \\\\x9b31m`));
  assert.match(text.out, /\\e\[31mred: producer/);
  const why = (p: { pid: number; start: string }, reason: RegExp) => assert.match(text.out, new RegExp(`Could not use the record ${p.pid}-${p.start}\\.json: ${reason.source}`));
  why(zero, /is a symbolic link/);
  why(fifo, /is a FIFO, not a regular file/);
  why(malformed, /not a status record: updatedAt is not a time/);
  if (foreign) why(foreign, /it belongs to uid \d+, not to this user/);
  why(huge, /holds 33554432 bytes, more than the 16777216 it may/);
  why(notJson, /not JSON/);

  const json = await run(['status', '--json'], env);
  assert.equal(json.code, 0, json.err);
  assert.doesNotMatch(json.out.replace(/\n/g, ''), RAW_CONTROL);
  const snapshot = JSON.parse(json.out) as { processes: Array<{ pid: number; argv: string[] }>; unreadable: unknown[] };
  assert.equal(snapshot.processes.find((p) => p.pid === escapes.pid)?.argv[1], '\x1b]0;pwned\x07', 'JSON keeps the value, escaped');
  assert.equal(snapshot.unreadable.length, foreign ? 6 : 5);

  const top = await run(['top', '--iterations', '1'], env);
  assert.equal(top.code, 0, top.err);
  assert.doesNotMatch(top.out, RAW_CONTROL);
  report('status/top/status --json over planted records: escape sequences (title, clear, CR/LF, bidi, C1), /dev/zero symlink, FIFO, malformed, another uid\'s, 32 MiB, not JSON',
    `escapes printed escaped; ${snapshot.unreadable.length} records skipped and named with the reason; exit 0, no hang`, 'nothing removed');
});

test('spawnPython of a module from a directory holding a planted cuda_ipc.py', { skip: skip ?? noPython }, async () => {
  const dir = shared(0o777);
  const marker = join(dir, 'PLANTED-CODE-RAN');
  const evil = `import os\nopen(${JSON.stringify(marker)}, "w").write("ran as uid %d" % os.getuid())\nraise SystemExit(3)\n`;
  for (const name of ['cuda_ipc.py', 'link_child.py']) {
    writeFileSync(join(dir, name), evil);
    theirs(join(dir, name));
  }
  const env = { ...process.env, PYTHONPATH: dirname(pythonFixture('link_child.py')) };
  // The control: plain `python3 -m` from there runs the planted code.
  spawnSync(PYTHON, ['-m', 'link_child'], { cwd: dir, env: { ...env, PYTHONPATH: `${PYTHON_PACKAGE_DIR}:${env.PYTHONPATH}` }, stdio: 'ignore' });
  const control = existsSync(marker);
  rmSync(marker, { force: true });
  const { child, link } = await spawnPython('link_child', [], { cwd: dir, env });
  link.send({ op: 'whoami' });
  const who = (await link.receive()) as { pid: number };
  assert.equal(who.pid, child.pid);
  await link.end();
  await once(child, 'exit');
  assert.equal(existsSync(marker), false, 'the planted module never ran');
  report('spawnPython(\'link_child\') with cuda_ipc.py and link_child.py planted in its working directory',
    `the real modules ran, the planted ones never did (plain python3 -m from there: planted code ${control ? 'ran' : 'did not run'})`, 'nothing run as the victim');
});
