// Link URLs: one set of rules in both languages. test/fixtures/link-urls.json lists bad and good
// URLs; python/tests/test_link_url.py reads the same list. Every bad one is a TypeError
// ERR_INVALID_URL naming the accepted forms, from parseLinkUrl, from listen()/connect() (options
// such as a token do not change that) and, in the CLI, a usage error (exit 2) before any wait.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseLinkUrl, isUrl, LINK_URL_FORMS, type LinkUrl } from '../../src/link/transport/link-url.js';
import { connect, listen } from '../../src/link/index.js';

interface Case { url: string; for: 'listen' | 'connect' | 'both'; says?: string; scheme?: string; host?: string; port?: number; family?: number }
const list = JSON.parse(readFileSync(new URL('../../../test/fixtures/link-urls.json', import.meta.url), 'utf8')) as { bad: Case[]; good: Case[]; notUrls: string[] };
const whats = (c: Case) => (c.for === 'both' ? (['listen', 'connect'] as const) : [c.for]);
const TOKEN = 'link-url-test-token-0123456789';
const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'link-url-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const invalidUrl = (c: Case) => (e: unknown) => {
  assert.ok(e instanceof TypeError, `${JSON.stringify(c.url)}: ${String(e)}`);
  assert.equal((e as { code?: string }).code, 'ERR_INVALID_URL', (e as Error).message);
  assert.ok((e as Error).message.includes(c.says!), `${JSON.stringify(c.url)}: '${(e as Error).message}' should say '${c.says}'`);
  assert.ok((e as Error).message.includes(LINK_URL_FORMS), 'the message names the accepted forms');
  assert.ok(!/[\n\r]/.test((e as Error).message), 'control characters are escaped');
  return true;
};

test('the shared list: every bad URL is ERR_INVALID_URL saying why, every good one parses to its parts', () => {
  assert.ok(list.bad.length >= 30 && list.good.length >= 8, 'the list is there');
  let checked = 0;
  for (const c of list.bad) {
    for (const what of whats(c)) {
      assert.throws(() => parseLinkUrl(c.url, what), invalidUrl(c));
      checked++;
    }
  }
  for (const c of list.good) {
    for (const what of whats(c)) {
      assert.deepEqual(parseLinkUrl(c.url, what), { scheme: c.scheme, host: c.host, port: c.port, family: c.family }, `${c.url} for ${what}`);
      checked++;
    }
  }
  assert.ok(checked > list.bad.length + list.good.length);
  for (const name of list.notUrls) assert.equal(isUrl(name), false, name);
  for (const c of [...list.bad, ...list.good]) {
    if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(c.url)) assert.equal(isUrl(c.url), true, c.url);
  }
});

test('listen() and connect() refuse every bad URL written as SCHEME:// with ERR_INVALID_URL, whatever the options (never a link name, never "unknown option")', async () => {
  let n = 0;
  for (const c of list.bad) {
    if (!isUrl(c.url)) continue;
    if (c.for !== 'connect') {
      await assert.rejects(listen(c.url as LinkUrl, { token: TOKEN }), invalidUrl(c));
      n++;
    }
    if (c.for !== 'listen') {
      await assert.rejects(connect(c.url, { token: TOKEN, timeout: 0 }), invalidUrl(c));
      await assert.rejects(connect(c.url), invalidUrl(c));
      n++;
    }
  }
  assert.ok(n >= 40, `${n} checked`);
  // The issue's own case: a foreign scheme with a TCP option, and with options only a link name takes.
  await assert.rejects(connect('http://x', { token: TOKEN }), invalidUrl({ url: 'http://x', for: 'connect', says: 'its scheme is http://' }));
  await assert.rejects(connect('http://x', { directory: dir } as object), invalidUrl({ url: 'http://x', for: 'connect', says: 'its scheme is http://' }));
  // A URL typed as a plain string reaches the name overload: still taken as a URL (a rejected promise).
  await assert.rejects(listen('http://x' as string) as unknown as Promise<unknown>, invalidUrl({ url: 'http://x', for: 'listen', says: 'its scheme is http://' }));
});

function runCli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [cli, ...args], { encoding: 'utf8', env: { ...process.env, XDG_RUNTIME_DIR: dir, CUDA_IPC_TOKEN: TOKEN }, cwd: dir, timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('the CLI: a bad URL is a usage error (exit 2) naming the forms, before any wait is printed; a foreign scheme is never a file', () => {
  for (const [args, says] of [
    [['consume', 'tcp://127.0.0.1'], 'has no port'],
    [['consume', 'http://x'], 'its scheme is http://'],
    [['consume', 'http://x/handle.json', '--timeout', '1'], 'its scheme is http://'],
    [['consume', 'tcp://[::1]'], 'has no port'],
    [['consume', 'tcp://127.0.0.1:0'], 'has port 0'],
    [['produce', '--listen', 'http://x'], 'its scheme is http://'],
    [['produce', '--listen', 'tcp://localhost:0'], 'binds an IP address exactly'],
    [['produce', '--listen', 'tcp://127.0.0.1'], 'has no port'],
  ] as const) {
    const r = runCli([...args]);
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
    assert.ok(r.stderr.includes(says), `${args.join(' ')}: ${r.stderr}`);
    assert.ok(r.stderr.includes('tcp://HOST:PORT'), r.stderr);
    assert.doesNotMatch(r.stdout, /waiting|connecting|listening/, 'nothing waited');
    assert.doesNotMatch(r.stderr, /directory|    at /, 'not taken for a file; no stack trace');
  }
  assert.deepEqual(readdirSync(dir).filter((f) => !f.startsWith('cuda-ipc')), [], 'no file was made for a URL');
});
