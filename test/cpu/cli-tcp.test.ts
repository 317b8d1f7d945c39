// The two-terminal example across machines, on one machine's loopback: `cuda-ipc produce --listen
// tcp://127.0.0.1:0` and `cuda-ipc consume tcp://...`, the token from CUDA_IPC_TOKEN or
// --token-file (never the command line); a wrong or missing token fails both sides (exit 1,
// ERR_AUTH_FAILED: the producer prints the refusal as it happens); `cuda-ipc token` prints a fresh one.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cli-tcp-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const TOKEN = 'cli-test-token-0123456789';

interface Run {
  code: number | null;
  out: string;
  err: string;
}

/** Runs the CLI; `onLine` sees each stdout line as it comes. */
function run(args: string[], env: NodeJS.ProcessEnv, onLine?: (line: string) => void): Promise<Run> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, XDG_RUNTIME_DIR: dir, ...env } });
    let out = '';
    let err = '';
    createInterface({ input: p.stdout! }).on('line', (l) => {
      out += `${l}\n`;
      onLine?.(l);
    });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => setImmediate(() => resolve({ code, out, err })));
  });
}

/** A producer listening on a free port, and the URL it printed. */
async function producer(args: string[], env: NodeJS.ProcessEnv): Promise<{ url: string; done: Promise<Run> }> {
  let found: (url: string) => void;
  const url = new Promise<string>((r) => (found = r));
  const done = run(['produce', '--listen', 'tcp://127.0.0.1:0', '--elements', '50000', '--timeout', '30', ...args], env, (line) => {
    const m = /^listening at (tcp:\/\/127\.0\.0\.1:\d+);/.exec(line);
    if (m) found(m[1]!);
  });
  const u = await Promise.race([url, done.then((r) => { throw new Error(`the producer exited (${r.code}): ${r.out}${r.err}`); })]);
  return { url: u, done };
}

test('produce --listen and consume tcp://: the consumer doubles a copy, sends it back, the producer checks it and its own unchanged buffer (token from CUDA_IPC_TOKEN)', async () => {
  const env = { CUDA_IPC_TOKEN: TOKEN };
  const p = await producer([], env);
  const c = await run(['consume', p.url, '--timeout', '30'], env);
  const pr = await p.done;
  assert.equal(c.code, 0, c.out + c.err);
  assert.equal(pr.code, 0, pr.out + pr.err);
  assert.match(pr.out, /^producer \d+: 50000 float32, in host memory \(no GPU here: /m);
  assert.match(pr.out, /consumer connected from 127\.0\.0\.1 port \d+; sending 0\.5, 1\.5, 2\.5, 3\.5, 4\.5, \.\.\. in host memory \(a TCP link carries a copy of its bytes\)/);
  assert.match(c.out, /received a copy of 50000 float32 \(200000 bytes over TCP\): 0\.5, 1\.5/);
  assert.match(c.out, /verified every element and doubled them in its copy: 1, 3, 5, 7, 9/);
  assert.match(pr.out, /doubled its copy and sent it back: 1, 3, 5, 7, 9, \.\.\.; this side's buffer is unchanged: 0\.5, 1\.5, 2\.5, 3\.5, 4\.5, \.\.\. OK/);
  assert.match(pr.out, /copied 200000 bytes out and 200000 bytes in over TCP/);
});

test('--token-file gives the token instead of CUDA_IPC_TOKEN (a file others may read is refused: cli-token-file.test.ts)', async () => {
  const file = join(dir, 'token');
  writeFileSync(file, `${TOKEN}\n`, { mode: 0o600 });
  const env = { CUDA_IPC_TOKEN: '' };
  const p = await producer(['--token-file', file], env);
  const c = await run(['consume', p.url, '--token-file', file], env);
  const pr = await p.done;
  assert.equal(pr.code, 0, pr.out + pr.err);
  assert.equal(c.code, 0, c.out + c.err);
  assert.equal(pr.err, '');
  assert.equal(c.err, '');
});

test('a wrong token fails both sides with ERR_AUTH_FAILED (exit 1); no token fails at once; a token is never an argument', async () => {
  const p = await producer([], { CUDA_IPC_TOKEN: TOKEN });
  const c = await run(['consume', p.url, '--timeout', '5'], { CUDA_IPC_TOKEN: 'a-different-token-of-length' });
  assert.equal(c.code, 1, c.out + c.err);
  assert.match(c.err, /\[ERR_AUTH_FAILED\] the listener at tcp:\/\/127\.0\.0\.1:\d+ did not prove the token: the two sides hold different tokens; give both the same one \(CUDA_IPC_TOKEN or --token-file FILE\)/);
  // The producer prints the refusal (who, why) as it happens and fails too (exit 1), long before its --timeout.
  const pr = await p.done;
  assert.equal(pr.code, 1, pr.out + pr.err);
  assert.match(pr.err, /producer: refused a connection: \[ERR_AUTH_FAILED\] the peer at 127\.0\.0\.1:\d+ /);
  assert.match(pr.err, /\[ERR_AUTH_FAILED\] a consumer connected with another token/);
  const none = await run(['consume', p.url], { CUDA_IPC_TOKEN: '' });
  assert.equal(none.code, 1);
  // The hints name the CLI's ways (issue 39.8), not the API's options.
  assert.match(none.err, /\[ERR_AUTH_FAILED\] a TCP link needs a token and none was given: set CUDA_IPC_TOKEN or pass --token-file FILE/);
  const noneP = await run(['produce', '--listen', 'tcp://127.0.0.1:0'], { CUDA_IPC_TOKEN: '' });
  assert.equal(noneP.code, 1);
  assert.match(noneP.err, /\[ERR_AUTH_FAILED\] a TCP link needs a token and none was given: set CUDA_IPC_TOKEN or pass --token-file FILE/);
  const short = await run(['consume', p.url], { CUDA_IPC_TOKEN: 'short' });
  assert.equal(short.code, 1);
  assert.match(short.err, /\[ERR_AUTH_FAILED\] the token in CUDA_IPC_TOKEN is 5 bytes; a token is at least 16 bytes/);
  for (const r of [c, none, noneP, short]) assert.doesNotMatch(r.err, /\{ token \}|options\.token/);
  const argv = await run(['consume', 'tcp://127.0.0.1:1', '--token', TOKEN], {});
  assert.equal(argv.code, 2, 'usage error');
  assert.match(argv.err, /unknown option '--token'; did you mean --token-file\?/);
  const both = await run(['produce', '--listen', 'tcp://127.0.0.1:0', '--out', join(dir, 'x.json')], { CUDA_IPC_TOKEN: TOKEN });
  assert.equal(both.code, 2);
  assert.match(both.err, /not both/);
  const tls = await run(['consume', 'tls://127.0.0.1:1'], { CUDA_IPC_TOKEN: TOKEN });
  assert.equal(tls.code, 2);
});

test('cuda-ipc token prints 32 fresh random bytes in base64url', () => {
  const a = spawnSync(process.execPath, [cli, 'token'], { encoding: 'utf8' });
  const b = spawnSync(process.execPath, [cli, 'token'], { encoding: 'utf8' });
  assert.equal(a.status, 0);
  assert.match(a.stdout, /^[A-Za-z0-9_-]{43}\n$/);
  assert.notEqual(a.stdout, b.stdout);
});
