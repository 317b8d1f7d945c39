// The Python package type-checks: `mypy --strict` over python/cuda_ipc (for Python 3.10, the oldest
// the package supports) finds no error. torch, CuPy, Numba and cuda.core are imported by name inside
// the package, so mypy needs none of them. Skips, saying how to install it, where mypy is missing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { PYTHON, PYTHON_PACKAGE_DIR } from '../helpers/python.js';

const INSTALL = 'apt-get update && apt-get install -y --no-install-recommends python3-mypy (Debian/Ubuntu, as root; see the README\'s Developing section), or pip install mypy';

/** The first way to run mypy that answers --version: its own command, or the module in python3
 * (Debian's python3-mypy installs only the module, for the system's /usr/bin/python3). */
function findMypy(): string[] | undefined {
  const candidates = [['mypy'], [PYTHON, '-m', 'mypy'], ['/usr/bin/python3', '-m', 'mypy']];
  for (const [cmd, ...args] of candidates) {
    const r = spawnSync(cmd!, [...args, '--version'], { encoding: 'utf8' });
    if (!r.error && r.status === 0) return [cmd!, ...args];
  }
  return undefined;
}

const mypy = findMypy();
const skip = mypy ? undefined : `mypy is not installed: ${INSTALL}`;

test('mypy --strict accepts the Python package', { skip, timeout: 120_000 }, () => {
  const [cmd, ...args] = mypy!;
  // --cache-dir=/dev/null: no .mypy_cache left in the tree.
  const r = spawnSync(cmd!, [...args, '--strict', '--python-version', '3.10', '--cache-dir=/dev/null', 'cuda_ipc'], {
    cwd: PYTHON_PACKAGE_DIR, encoding: 'utf8', timeout: 110_000,
  });
  assert.equal(r.error, undefined, `${cmd} did not run: ${r.error?.message}`);
  assert.equal(r.status, 0, `mypy --strict found errors in python/cuda_ipc:\n${r.stdout}${r.stderr}`);
  assert.match(r.stdout, /^Success: no issues found/m);
});
