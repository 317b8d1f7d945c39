// native/nccl_abi.h must match NCCL's own nccl.h: constants, the unique id, the ncclConfig_t prefix
// we declare, and every signature. Runs wherever an nccl.h and a cuda_runtime.h are found (a CUDA
// toolkit with libnccl-dev, or PyTorch's nvidia-* wheels, which carry both); skips elsewhere.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { wheelLibraries } from '../../src/nccl/discovery.js';
import { PYTHON } from '../helpers/python.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const cxx = process.env.CXX ?? 'g++';
// nvidia/nccl/lib/libnccl.so.2 -> nvidia/
const wheelRoots = (await wheelLibraries(PYTHON)).paths.map((p) => dirname(dirname(dirname(p))));
const find = (file: string, dirs: Array<string | undefined>): string | undefined =>
  dirs.filter((d): d is string => !!d).find((d) => existsSync(join(d, file)));
const ncclInclude = find('nccl.h', [
  process.env.NCCL_HOME && join(process.env.NCCL_HOME, 'include'), '/usr/include', '/usr/local/include', '/usr/local/cuda/include',
  ...wheelRoots.map((r) => join(r, 'nccl', 'include')),
]);
const cudaInclude = find('cuda_runtime.h', [
  process.env.CUDA_HOME && join(process.env.CUDA_HOME, 'include'), '/usr/local/cuda/include', '/usr/include',
  ...wheelRoots.map((r) => join(r, 'cuda_runtime', 'include')),
]);

/** Why nccl.h alone does not compile with these include folders (missing headers of its own), if it does not. */
function headerProblem(): string | undefined {
  const dir = mkdtempSync(join(tmpdir(), 'nccl-h-'));
  try {
    writeFileSync(join(dir, 'only.cc'), '#include <nccl.h>\n');
    const r = spawnSync(cxx, ['-std=c++17', '-fsyntax-only', `-I${ncclInclude}`, `-I${cudaInclude}`, join(dir, 'only.cc')], { encoding: 'utf8' });
    if (r.error) return `no C++ compiler (${cxx}: ${r.error.message})`;
    return r.status === 0 ? undefined : `nccl.h does not compile here by itself: ${r.stderr.trim().split('\n')[0]}`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const skip = !ncclInclude ? 'no nccl.h here (libnccl-dev, a CUDA toolkit with NCCL, or the nvidia-nccl wheel)'
  : !cudaInclude ? `nccl.h (${ncclInclude}) needs cuda_runtime.h, which is not here` : headerProblem();

function compile(dir: string): ReturnType<typeof spawnSync> {
  return spawnSync(cxx, ['-std=c++17', '-fsyntax-only', `-I${ncclInclude}`, `-I${cudaInclude}`, join(dir, 'nccl_abi_check.cc')], { encoding: 'utf8' });
}

test('nccl_abi.h matches nccl.h', { skip }, (t) => {
  t.diagnostic(`nccl.h from ${ncclInclude}, cuda_runtime.h from ${cudaInclude}`);
  const r = compile(join(root, 'native'));
  assert.equal(r.status, 0, `nccl_abi_check.cc failed to compile against ${ncclInclude}/nccl.h:\n${String(r.stderr)}`);
});

test('the NCCL ABI check notices a wrong signature or constant', { skip }, () => {
  // Guard against a check that cannot fail: break the header in a copy and expect the check to say so.
  const dir = mkdtempSync(join(tmpdir(), 'nccl-abi-'));
  try {
    const header = readFileSync(join(root, 'native/nccl_abi.h'), 'utf8');
    const broken = header
      .replace('X(ncclCommFinalize, ncclResult_t, (ncclComm_t comm))', 'X(ncclCommFinalize, ncclResult_t, (int comm))')
      .replace('constexpr ncclResult_t ncclInProgress = 7;', 'constexpr ncclResult_t ncclInProgress = 8;')
      .replace('  int blocking;\n', '  long blocking;\n');
    assert.notEqual(broken, header);
    writeFileSync(join(dir, 'nccl_abi.h'), broken);
    copyFileSync(join(root, 'native/nccl_abi_check.cc'), join(dir, 'nccl_abi_check.cc'));
    const r = compile(dir);
    assert.notEqual(r.status, 0);
    assert.match(String(r.stderr), /signature of ncclCommFinalize differs from nccl\.h/);
    assert.match(String(r.stderr), /ncclInProgress differs from nccl\.h/);
    assert.match(String(r.stderr), /ncclConfig_t\.blocking differs from nccl\.h/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
