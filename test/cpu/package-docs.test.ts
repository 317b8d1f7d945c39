// What `npm pack` would put in the tarball (its file list, without building: --ignore-scripts),
// checked for what a user of the installed package reads and runs: every link of the shipped
// README.md, python/README.md and docs resolves inside the package or is a public URL (the package
// names no repository to follow a link to), and package.json is one npm takes as it is, with no
// lifecycle script that needs what is not shipped. test/cpu/package.test.ts checks the real
// tarball (built, installed and run) the same way, where the npm registry is reachable.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brokenLinks, markdownLinks } from '../helpers/doc-links.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const noNpm = (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, 'npm'))) ? undefined : 'npm is not on PATH here';

/** Lifecycle scripts npm runs in an installed package (or lists to the user before it does). */
const INSTALL_LIFECYCLE = ['preinstall', 'install', 'postinstall', 'prepublish', 'preprepare', 'prepare', 'postprepare'];

function packedFiles(): string[] {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `npm pack --dry-run failed: ${r.stderr}`);
  return (JSON.parse(r.stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path);
}

test('the link checker finds links in prose only, and refuses what an npm user cannot follow', () => {
  const md = [
    '[a](docs/a.md) ![i](img.png "title") [in page](#x) \\[dispose\\]() `[code](not/a/link.md)`',
    '```ts', '[fenced](also/not.md)', '```',
    '[ref]: ../outside.md', '<a href="https://example.com/x">x</a> [local](http://localhost:8080/) [f](file:///etc/passwd)',
  ].join('\n');
  assert.deepEqual(markdownLinks(md), ['docs/a.md', 'img.png', '#x', 'http://localhost:8080/', 'file:///etc/passwd', '../outside.md', 'https://example.com/x']);
  const broken = brokenLinks(['README.md', 'docs/a.md'], () => md).filter((b) => b.file === 'README.md').map((b) => b.target);
  assert.deepEqual(broken, ['img.png', 'http://localhost:8080/', 'file:///etc/passwd', '../outside.md']);
});

test('every link of the shipped README.md, python/README.md and docs resolves inside the package', { skip: noNpm }, () => {
  const files = packedFiles();
  for (const f of ['README.md', 'python/README.md', 'docs/api/README.md', 'docs/PROTOCOL.md']) assert.ok(files.includes(f), `the package lacks ${f}`);
  const docs = files.filter((f) => f.endsWith('.md'));
  assert.ok(docs.length > 100, `only ${docs.length} Markdown files: is the API reference shipped?`);
  const broken = brokenLinks(files, (f) => readFileSync(join(root, f), 'utf8'));
  assert.deepEqual(broken, [], broken.map((b) => `${b.file}: (${b.target}) ${b.why}`).join('\n'));
});

test('package.json is what npm publishes unchanged, and its only install-time script is the addon\'s', { skip: noNpm }, () => {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  // npm publish "auto-corrects" what `npm pkg fix` would change, and drops a bin entry it finds invalid.
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-pkgfix-'));
  try {
    copyFileSync(join(root, 'package.json'), join(dir, 'package.json'));
    const r = spawnSync('npm', ['pkg', 'fix'], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')), pkg, 'npm pkg fix changes package.json: apply what it changes');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const lifecycle = Object.keys(pkg.scripts).filter((s) => INSTALL_LIFECYCLE.includes(s));
  assert.deepEqual(lifecycle, ['install'], 'an installed package runs (and npm lists) no build step that needs the repository');
  assert.equal(pkg.scripts.install, 'node-gyp-build');
});
