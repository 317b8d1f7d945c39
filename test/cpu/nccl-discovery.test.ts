// Finding NCCL (src/nccl/library.ts, discovery.ts, probe.ts) with a fake libnccl: the order
// (options.path > CUDA_IPC_NCCL_LIBRARY > the system's libnccl.so.2 > PyTorch's wheel), the
// failure that names every place looked in, broken libraries failing in the probe process rather
// than here, version parsing, and `cuda-ipc info`.
import { describe, test, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { realpathSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fakeNccl, noFakeNccl, resetFakeEnv } from '../helpers/fake-nccl.js';
import { PYTHON } from '../helpers/python.js';
import { loadNccl, formatNcclVersion, NcclUnavailableError, NCCL_LIBRARY_ENV } from '../../src/nccl/index.js';
import { probeLibraries } from '../../src/nccl/probe.js';
import { forgetDiscoveries } from '../helpers/nccl-testing.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const saved = { env: process.env[NCCL_LIBRARY_ENV], ld: process.env.LD_LIBRARY_PATH, pythonPath: process.env.PYTHONPATH };

function restoreEnv(): void {
  const put = (k: string, v: string | undefined): void => {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  };
  put(NCCL_LIBRARY_ENV, saved.env);
  put('LD_LIBRARY_PATH', saved.ld);
  put('PYTHONPATH', saved.pythonPath);
}

// The system step finds whatever libnccl.so.2 the loader finds: where the machine has one, it
// comes before the wheel and before "nothing found", so those tests skip there.
const systemOutcome = (await probeLibraries(['libnccl.so.2']))[0]!;
const hasSystemNccl = systemOutcome.ok ? `this machine has a system libnccl.so.2 (${systemOutcome.path}), which comes first` : undefined;
const pythonMissing = spawnSync(PYTHON, ['-c', 'import importlib.util'], { encoding: 'utf8' }).status === 0 ? undefined : `${PYTHON} is not available`;

describe('NCCL discovery', { skip: noFakeNccl }, () => {
  const f = fakeNccl!;
  after(() => {
    restoreEnv();
    f.cleanup();
  });
  beforeEach(() => {
    restoreEnv();
    delete process.env[NCCL_LIBRARY_ENV];
    resetFakeEnv();
    forgetDiscoveries();
  });

  test('options.path comes first, and the library says what it is', async () => {
    process.env[NCCL_LIBRARY_ENV] = f.crash;  // never tried: the path given is the only one
    const lib = await loadNccl({ path: f.lib });
    assert.deepEqual(lib.toJSON(), { path: f.lib, version: '2.28.9', versionCode: 22809, source: 'option' });
    assert.equal(await loadNccl({ path: f.lib }), lib, 'loaded once, the same object after');
    const other = await loadNccl({ path: f.copy('other/libnccl.so.2') });
    assert.notEqual(other, lib, 'another file is another library');
  });

  test('CUDA_IPC_NCCL_LIBRARY comes next, before the system\'s library', async () => {
    const systemDir = join(f.dir, 'system-a');
    f.copy('system-a/libnccl.so.2');
    process.env.LD_LIBRARY_PATH = systemDir;  // read by the probe process as it starts
    const chosen = f.copy('env-a/libnccl.so.2');
    process.env[NCCL_LIBRARY_ENV] = chosen;
    const lib = await loadNccl();
    assert.equal(lib.path, chosen);
    assert.equal(lib.source, 'env');
  });

  test('a library named by CUDA_IPC_NCCL_LIBRARY that fails is not replaced by another', async () => {
    f.copy('system-b/libnccl.so.2');
    process.env.LD_LIBRARY_PATH = join(f.dir, 'system-b');
    process.env[NCCL_LIBRARY_ENV] = f.old;
    await assert.rejects(loadNccl(), (e: unknown) => {
      assert.ok(e instanceof NcclUnavailableError);
      assert.equal(e.code, 'ERR_NCCL_UNAVAILABLE');
      assert.deepEqual(e.attempts.map((a) => [a.source, a.path]), [['env', f.old]]);
      assert.match(e.message, /CUDA_IPC_NCCL_LIBRARY: .*old\.so: it does not export ncclCommInitRankConfig, ncclCommFinalize \(not NCCL, or NCCL older than 2\.14\)/);
      return true;
    });
  });

  test('without a choice, the system\'s libnccl.so.2 (the loader\'s search path) comes before the wheel', { skip: hasSystemNccl ?? pythonMissing }, async () => {
    const system = f.copy('system-c/libnccl.so.2');
    const wheel = f.copy('site-c/nvidia/nccl/lib/libnccl.so.2');
    process.env.LD_LIBRARY_PATH = join(f.dir, 'system-c');
    process.env.PYTHONPATH = join(f.dir, 'site-c');
    const lib = await loadNccl({ python: PYTHON });
    assert.equal(lib.source, 'system');
    assert.equal(lib.path, system, 'the file the loader chose, by its full path');
    assert.notEqual(lib.path, wheel);
  });

  test('then PyTorch\'s wheel: nvidia/nccl/lib/libnccl.so.2 where python3 finds the nvidia package', { skip: hasSystemNccl ?? pythonMissing }, async () => {
    const wheel = f.copy('site-d/nvidia/nccl/lib/libnccl.so.2');
    process.env.PYTHONPATH = join(f.dir, 'site-d');
    const lib = await loadNccl({ python: PYTHON });
    assert.equal(lib.source, 'wheel');
    assert.equal(realpathSync(lib.path), realpathSync(wheel));
  });

  test('nothing found: ERR_NCCL_UNAVAILABLE names every place looked in and why', { skip: hasSystemNccl }, async () => {
    const python = join(f.dir, 'no-such-python3');
    await assert.rejects(loadNccl({ python }), (e: unknown) => {
      assert.ok(e instanceof NcclUnavailableError);
      assert.equal(e.code, 'ERR_NCCL_UNAVAILABLE');
      assert.deepEqual(e.attempts.map((a) => a.source), ['system', 'wheel']);
      assert.match(e.attempts[0]!.error, /libnccl\.so\.2: cannot open shared object file/);
      assert.match(e.attempts[1]!.error, new RegExp(`${python.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} was not found`));
      assert.match(e.message, /the system's libnccl\.so\.2 \(the dynamic loader's search path/);
      assert.match(e.message, /PyTorch's NCCL wheel: nvidia\/nccl\/lib\/libnccl\.so\.2 in .*no-such-python3's site-packages/);
      assert.match(e.message, /CUDA_IPC_NCCL_LIBRARY=\/path\/to\/libnccl\.so\.2/);
      return true;
    });
  });

  test('a library that aborts when loaded kills the probe process, not this one', async () => {
    const before = process.pid;
    await assert.rejects(loadNccl({ path: f.crash }), (e: unknown) => {
      assert.ok(e instanceof NcclUnavailableError);
      assert.deepEqual(e.attempts.map((a) => a.source), ['option']);
      assert.match(e.attempts[0]!.error, /loading it killed the probe process with SIGABRT/);
      return true;
    });
    assert.equal(process.pid, before);
    // And this process never loaded it: it still loads a good one.
    assert.equal((await loadNccl({ path: f.lib })).version, '2.28.9');
  });

  test('a file that is not ELF fails with the loader\'s message', async () => {
    await assert.rejects(loadNccl({ path: f.notElf }), (e: unknown) => {
      assert.ok(e instanceof NcclUnavailableError);
      assert.match(e.attempts[0]!.error, /invalid ELF header|file too short/);
      return true;
    });
  });

  test('the probe goes on after a candidate that crashed it, in a new process', async () => {
    const outcomes = await probeLibraries([f.crash, f.notElf, f.lib, f.old]);
    assert.equal(outcomes.length, 3, 'it stops at the first that loads');
    assert.deepEqual(outcomes.map((o) => o.ok), [false, false, true]);
    assert.match((outcomes[0] as { message: string }).message, /SIGABRT/);
    assert.deepEqual(outcomes[2], { ok: true, path: f.lib, version: 22809 });
  });

  test('versions: NCCL_VERSION codes of both schemes, from the library itself', async () => {
    assert.equal(formatNcclVersion(22809), '2.28.9');
    assert.equal(formatNcclVersion(22803), '2.28.3');
    assert.equal(formatNcclVersion(21903), '2.19.3');
    assert.equal(formatNcclVersion(2804), '2.8.4', 'up to 2.8: X*1000 + Y*100 + Z');
    assert.equal(formatNcclVersion(30001), '3.0.1');
    process.env.FAKE_NCCL_VERSION = '21903';  // read by the probe process and by this one
    const lib = await loadNccl({ path: f.copy('v21903/libnccl.so.2') });
    assert.equal(lib.version, '2.19.3');
    assert.equal(lib.versionCode, 21903);
  });

  test('bad options are TypeErrors', async () => {
    await assert.rejects(loadNccl({ path: '' }), { code: 'ERR_INVALID_ARG_TYPE', name: 'TypeError' });
    await assert.rejects(loadNccl({ python: 3 as unknown as string }), { code: 'ERR_INVALID_ARG_TYPE' });
    await assert.rejects(loadNccl('x' as never), { code: 'ERR_INVALID_ARG_TYPE' });
  });

  test('`cuda-ipc info` shows the NCCL found, or why none was, and exits 0 either way', () => {
    const run = (env: NodeJS.ProcessEnv, ...args: string[]) =>
      spawnSync(process.execPath, [cli, 'info', ...args], { encoding: 'utf8', env: { ...process.env, ...env } });
    const json = run({ [NCCL_LIBRARY_ENV]: f.lib }, '--json');
    assert.equal(json.status, 0, json.stderr);
    assert.deepEqual(JSON.parse(json.stdout).nccl, { available: true, path: f.lib, version: '2.28.9', versionCode: 22809, source: 'env' });
    const text = run({ [NCCL_LIBRARY_ENV]: f.lib });
    assert.equal(text.status, 0, text.stderr);
    assert.ok(text.stdout.includes(`NCCL: 2.28.9 (${f.lib}, found by CUDA_IPC_NCCL_LIBRARY)`), text.stdout);

    const broken = run({ [NCCL_LIBRARY_ENV]: f.crash }, '--json');
    assert.equal(broken.status, 0, broken.stderr);
    const nccl = JSON.parse(broken.stdout).nccl;
    assert.equal(nccl.available, false);
    assert.equal(nccl.error.code, 'ERR_NCCL_UNAVAILABLE');
    assert.deepEqual(nccl.attempts.map((a: { source: string; path: string }) => [a.source, a.path]), [['env', f.crash]]);
    const brokenText = run({ [NCCL_LIBRARY_ENV]: f.crash });
    assert.equal(brokenText.status, 0);
    assert.match(brokenText.stdout, /NCCL: not available \(ERR_NCCL_UNAVAILABLE\)\n {2}by CUDA_IPC_NCCL_LIBRARY: .*crash\.so: loading it killed the probe process with SIGABRT/);
  });
});
