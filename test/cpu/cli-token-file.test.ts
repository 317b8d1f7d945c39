// Issue 40.5: `--token-file` is refused (ERR_FILE_UNSAFE, exit 1, before any connection) unless it is
// a regular file owned by the caller that neither group nor others may read or write; the message
// says the chmod/chown to run. Cases: mode 0644, mode 0620, another owner (chown nobody: needs root),
// a symbolic link to a good file, a FIFO (never waited on); a good file is taken.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cli-token-file-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const TOKEN = 'cli-test-token-0123456789';
const NOBODY = 65534;

/** `cuda-ipc consume tcp://127.0.0.1:1 --token-file FILE` (nothing listens there: a taken token fails later, at the connection). */
function consumeWith(file: string): Promise<{ code: number | null; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, 'consume', 'tcp://127.0.0.1:1', '--timeout', '1', '--token-file', file], {
      stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, XDG_RUNTIME_DIR: dir, CUDA_IPC_TOKEN: '' },
    });
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => setImmediate(() => resolve({ code, err })));
  });
}

function tokenFile(name: string, mode: number): string {
  const path = join(dir, name);
  writeFileSync(path, `${TOKEN}\n`);
  chmodSync(path, mode);  // not through writeFileSync's mode, which the umask trims
  return path;
}

test('a token file others may read or write is refused, saying chmod 600', async () => {
  for (const mode of [0o644, 0o620, 0o604]) {
    const file = tokenFile(`loose-${mode.toString(8)}`, mode);
    const r = await consumeWith(file);
    assert.equal(r.code, 1, r.err);
    assert.match(r.err, new RegExp(`\\[ERR_FILE_UNSAFE\\] the token file .*loose-${mode.toString(8)} may be read or written by other users \\(mode ${mode.toString(8)}\\).*chmod 600`));
  }
});

test('a token file of another owner is refused, saying the chown', { skip: process.getuid?.() === 0 ? undefined : 'chown to another user needs root' }, async () => {
  const file = tokenFile('theirs', 0o600);
  chownSync(file, NOBODY, NOBODY);
  const r = await consumeWith(file);
  assert.equal(r.code, 1, r.err);
  assert.match(r.err, new RegExp(`\\[ERR_FILE_UNSAFE\\] the token file .*theirs belongs to uid ${NOBODY}, not to this user \\(uid ${process.getuid!()}\\).*chown ${process.getuid!()} `));
});

test('a symbolic link and a FIFO are refused without being followed or waited on', async () => {
  const good = tokenFile('good-target', 0o600);
  const link = join(dir, 'link');
  symlinkSync(good, link);
  const viaLink = await consumeWith(link);
  assert.equal(viaLink.code, 1, viaLink.err);
  assert.match(viaLink.err, /\[ERR_FILE_UNSAFE\] the token file .*link is a symbolic link/);
  const fifo = join(dir, 'fifo');
  assert.equal(spawnSync('mkfifo', ['-m', '600', fifo]).status, 0, 'mkfifo');
  const viaFifo = await consumeWith(fifo);
  assert.equal(viaFifo.code, 1, viaFifo.err);
  assert.match(viaFifo.err, /\[ERR_FILE_UNSAFE\] the token file .*fifo is a FIFO, not a regular file/);
});

test('a regular file of this user, mode 0600, is taken (the command goes on to connect)', async () => {
  const r = await consumeWith(tokenFile('good', 0o600));
  assert.doesNotMatch(r.err, /token file/);
  assert.match(r.err, /ERR_NO_LISTENER|ERR_TIMEOUT|ECONNREFUSED|no listener/i, 'it failed at the connection, not at the token');
});
