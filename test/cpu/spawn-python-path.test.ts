// Issue 40.6: an empty PYTHONPATH entry (a trailing ':') is the working directory to Python; under
// spawnPython it must not put the working directory back on sys.path, where a planted json.py (which
// the cuda_ipc package imports first thing) would run as the user. The entries are dropped, and a
// warning (code CUDA_IPC_PYTHONPATH) says so once per process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { spawnPython } from '../../src/link/index.js';
import { safePythonPath } from '../../src/link/connect/spawn-python.js';
import { PYTHON, noPython, pythonFixture } from '../helpers/python.js';

test('safePythonPath drops empty entries only', () => {
  assert.equal(safePythonPath(undefined), undefined);
  assert.equal(safePythonPath(''), undefined);
  assert.equal(safePythonPath('/a:'), '/a');
  assert.equal(safePythonPath(':/a::/b:'), '/a:/b');
  assert.equal(safePythonPath('/a:/b'), '/a:/b');
});

test('spawnPython with a trailing-colon PYTHONPATH from a directory holding a planted json.py: the planted module never runs', { skip: noPython }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-pythonpath-'));
  try {
    const marker = join(dir, 'PLANTED-JSON-RAN');
    writeFileSync(join(dir, 'json.py'), `open(${JSON.stringify(marker)}, "w").write("ran")\nraise SystemExit(3)\n`);
    const PYTHONPATH = `${dirname(pythonFixture('link_child.py'))}:`;
    // The control: with that PYTHONPATH, plain python3 in safe-path mode (-P: no script or working
    // directory of its own on sys.path) still imports the planted json.py, through the empty entry.
    const control = spawnSync(PYTHON, ['-P', '-c', 'import json'], { cwd: dir, env: { ...process.env, PYTHONPATH }, stdio: 'ignore' });
    assert.equal(existsSync(marker), true, `the control did not run the planted module (exit ${control.status}): the test would prove nothing`);
    rmSync(marker);

    const warnings: Error[] = [];
    const onWarning = (w: Error) => {
      if ((w as { code?: string }).code === 'CUDA_IPC_PYTHONPATH') warnings.push(w);
    };
    process.on('warning', onWarning);
    try {
      const { child, link } = await spawnPython('link_child', [], { cwd: dir, env: { ...process.env, PYTHONPATH } });
      link.send({ op: 'whoami' });
      const who = (await link.receive({ timeout: 30_000 })) as { pid: number };
      assert.equal(who.pid, child.pid);
      await link.end();
      await once(child, 'exit');
      // Warnings are emitted on the next tick: one more turn, then count.
      await new Promise((r) => setImmediate(r));
    } finally {
      process.off('warning', onWarning);
    }
    assert.equal(existsSync(marker), false, 'the planted json.py ran in the child');
    assert.equal(warnings.length, 1, 'one warning says the empty entries were dropped');
    assert.match(warnings[0]!.message, /empty entries, which Python reads as the working directory/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
