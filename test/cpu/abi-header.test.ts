// native/cuda_abi.h must match the toolkit's cuda.h: constants, struct layouts and signatures.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync, copyFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const includeDirs = [process.env.CUDA_HOME && join(process.env.CUDA_HOME, 'include'), '/usr/local/cuda/include']
  .filter((d): d is string => !!d);
const include = includeDirs.find((d) => existsSync(join(d, 'cuda.h')));
const cxx = process.env.CXX ?? 'g++';

test('cuda_abi.h matches cuda.h', { skip: include ? undefined : 'no CUDA toolkit (cuda.h) here' }, () => {
  const r = spawnSync(cxx, ['-std=c++17', '-fsyntax-only', `-I${include}`, join(root, 'native/abi_check.cc')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `abi_check.cc failed to compile against ${include}/cuda.h:\n${r.stderr}`);
});

test('the ABI check notices a wrong signature or constant', { skip: include ? undefined : 'no CUDA toolkit (cuda.h) here' }, () => {
  // Guard against a check that cannot fail: break the header in a copy and expect the check to say so.
  const dir = mkdtempSync(join(tmpdir(), 'abi-'));
  try {
    const header = readFileSync(join(root, 'native/cuda_abi.h'), 'utf8');
    const broken = header
      .replace('X(cuMemFree, (CUdeviceptr dptr))', 'X(cuMemFree, (int dptr))')
      .replace('CU_EVENT_INTERPROCESS = 4,', 'CU_EVENT_INTERPROCESS = 8,');
    assert.notEqual(broken, header);
    writeFileSync(join(dir, 'cuda_abi.h'), broken);
    copyFileSync(join(root, 'native/abi_check.cc'), join(dir, 'abi_check.cc'));
    const r = spawnSync(cxx, ['-std=c++17', '-fsyntax-only', `-I${include}`, join(dir, 'abi_check.cc')], { encoding: 'utf8' });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /signature of cuMemFree differs from cuda\.h/);
    assert.match(r.stderr, /CU_EVENT_INTERPROCESS differs from cuda\.h/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
