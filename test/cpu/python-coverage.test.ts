// Coverage of the Python twins of the modules that hold bounds and checks (issue 41): their unit
// tests run under coverage.py (statements and branches), the table is printed, and a twin under its
// floor fails. The pure-Python ring runs (CUDA_IPC_PY_NATIVE=0), since the native helper would
// stand in for slot_ring.py. Skips, saying how to install it, where coverage.py is missing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PYTHON, PYTHON_PACKAGE_DIR } from '../helpers/python.js';

const INSTALL = 'apt-get update && apt-get install -y --no-install-recommends python3-coverage (Debian/Ubuntu, as root; .ci/run does), or pip install coverage';

/** Twin -> the least percentage (statements and branches) its tests must cover: a few points under
 * what they reached when the floor was set (2026-11-28). */
const FLOORS: Record<string, number> = {
  'cuda_ipc/link/transport/tcp_auth.py': 85,
  'cuda_ipc/link/connect/tcp.py': 75,
  'cuda_ipc/link/connect/listener.py': 60,
  'cuda_ipc/link/transport/frame.py': 70,
  'cuda_ipc/link/connection/frame_dispatch.py': 65,
  'cuda_ipc/link/messages/message_decoder.py': 80,
  'cuda_ipc/link/transport/socket_file.py': 65,
  'cuda_ipc/channel/slot_ring.py': 75,
  'cuda_ipc/channel/consumer.py': 75,
  'cuda_ipc/link/messages/nccl_records.py': 95,
};
const TESTS = [
  'test_nccl_records', 'test_nccl_records_bounds', 'test_frame_bounds', 'test_ring_bounds', 'test_channel', 'test_hostile', 'test_link',
  'test_listener', 'test_tcp_listener', 'test_tcp_hostile', 'test_tcp', 'test_security', 'test_large_message',
].map((t) => `tests.${t}`);

/** The first python3 with coverage.py (Debian's python3-coverage serves /usr/bin/python3). */
function findCoverage(): string | undefined {
  for (const py of [PYTHON, '/usr/bin/python3']) {
    const r = spawnSync(py, ['-m', 'coverage', '--version'], { encoding: 'utf8' });
    if (!r.error && r.status === 0) return py;
  }
  return undefined;
}

const python = findCoverage();
const skip = python ? undefined : `coverage.py is not installed: ${INSTALL}`;

test('the Python twins of the checked modules are covered by their tests at least to their floors', { skip, timeout: 280_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-pycov-'));
  try {
    const data = join(dir, 'coverage-data');
    const env = { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR, CUDA_IPC_PY_NATIVE: '0' };
    const run = spawnSync(python!, ['-m', 'coverage', 'run', '--branch', `--data-file=${data}`, `--include=${Object.keys(FLOORS).join(',')}`, '-m', 'unittest', ...TESTS], {
      cwd: PYTHON_PACKAGE_DIR, encoding: 'utf8', env, timeout: 270_000,
    });
    assert.equal(run.status, 0, `the unit tests under coverage failed:\n${run.stdout}\n${run.stderr}`);
    const json = join(dir, 'coverage.json');
    const report = spawnSync(python!, ['-m', 'coverage', 'json', `--data-file=${data}`, '-o', json], { cwd: PYTHON_PACKAGE_DIR, encoding: 'utf8' });
    assert.equal(report.status, 0, report.stderr);
    const files = (JSON.parse(readFileSync(json, 'utf8')) as { files: Record<string, { summary: { percent_covered: number } }> }).files;
    const under: string[] = [];
    console.log('Python coverage (statements and branches) of the twins with a floor:');
    for (const [file, floor] of Object.entries(FLOORS)) {
      const pct = files[file]?.summary.percent_covered ?? 0;
      console.log(`  ${file.padEnd(34)} ${pct.toFixed(1).padStart(5)}%  (floor ${floor}%)`);
      if (pct < floor) under.push(`${file}: ${pct.toFixed(1)}% < ${floor}%`);
    }
    assert.deepEqual(under, [], 'a twin is under its floor: test what its lines do, or say in review why the floor moves');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
