// Keeps the shipped PTX honest: it must be what scripts/gen-ptx.sh makes from kernels/*.cu, and
// it must declare exactly the kernels and parameters that src/cuda/builtin-kernels.ts lists.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { accessSync, constants, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BUILTIN_KERNELS, BUILTIN_PTX_FILE } from '../../src/cuda/builtin-kernels.js';
import type { KernelArgType } from '../../src/cuda/kernel-args.js';

// This file runs as dist/test/cpu/kernels-ptx.test.js.
const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
const kernelsDir = join(repoRoot, 'kernels');

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The nvcc gen-ptx.sh would use: $NVCC, nvcc on PATH, or /usr/local/cuda/bin/nvcc. */
function findNvcc(): string | undefined {
  if (process.env.NVCC) return process.env.NVCC;
  const onPath = (process.env.PATH ?? '').split(delimiter).filter(Boolean).map((dir) => join(dir, 'nvcc'));
  return [...onPath, '/usr/local/cuda/bin/nvcc'].find(isExecutable);
}

interface PtxEntry {
  readonly name: string;
  /** PTX parameter types in order, e.g. ['.u64', '.u32']. */
  readonly paramTypes: readonly string[];
}

/** Parses the `.entry name( .param .type name_param_N, ... )` declarations of a PTX module. */
function parsePtxEntries(ptx: string): PtxEntry[] {
  const entries: PtxEntry[] = [];
  for (const match of ptx.matchAll(/\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)/g)) {
    const [, name, paramList] = match as unknown as [string, string, string];
    const paramTypes = paramList
      .split(',')
      .map((p) => p.trim())
      .filter(Boolean)
      .map((p) => {
        const param = /^\.param\s+(\.[a-z]+\d+)\b/.exec(p);
        assert.ok(param, `${name}: cannot read parameter declaration "${p}"`);
        return param[1]!;
      });
    entries.push({ name: name!, paramTypes });
  }
  return entries;
}

// How nvcc declares each argument type in PTX. Types no built-in kernel uses yet are left out on
// purpose: whoever adds one adds its PTX form here after looking at what nvcc emits.
const PTX_PARAM_TYPE: Partial<Record<KernelArgType, string>> = {
  ptr: '.u64',
  u64: '.u64',
  i64: '.u64',
  u32: '.u32',
  i32: '.u32',
  f32: '.f32',
  f64: '.f64',
};

function ptxFilesIn(dir: string): string[] {
  return readdirSync(dir).filter((f) => f.endsWith('.ptx')).sort();
}

/** The compiler identification lines at the top of nvcc's PTX. */
function compilerHeader(ptx: string): string {
  return ptx
    .split('\n')
    .filter((line) => /^\/\/ (Compiler Build ID|Cuda compilation tools|Based on)/.test(line))
    .join('\n');
}

test('the shipped PTX declares exactly the kernels and parameters of builtin-kernels.ts', () => {
  const ptx = readFileSync(join(repoRoot, BUILTIN_PTX_FILE), 'utf8');
  // A low virtual target so the driver JIT-compiles it for any newer GPU.
  assert.match(ptx, /^\.target sm_75$/m);
  assert.match(ptx, /^\.address_size 64$/m);
  const entries = new Map(parsePtxEntries(ptx).map((e) => [e.name, e]));
  const listed = BUILTIN_KERNELS.filter((k) => k.ptxFile === BUILTIN_PTX_FILE);
  assert.deepEqual([...entries.keys()].sort(), listed.map((k) => k.name).sort(), 'entry names differ from the table');
  for (const kernel of listed) {
    const entry = entries.get(kernel.name)!;
    assert.equal(
      entry.paramTypes.length,
      kernel.params.length,
      `${kernel.name}: PTX has ${entry.paramTypes.length} parameters, the table ${kernel.params.length}`,
    );
    kernel.params.forEach((param, index) => {
      const expected = PTX_PARAM_TYPE[param.type];
      assert.ok(expected, `${kernel.name}: no known PTX form for ${param.type}; add it to PTX_PARAM_TYPE`);
      assert.equal(entry.paramTypes[index], expected, `${kernel.name} parameter ${index} (${param.name}: ${param.type})`);
    });
  }
});

test('the shipped PTX is what scripts/gen-ptx.sh makes from kernels/*.cu', (t) => {
  const nvcc = findNvcc();
  if (!nvcc) {
    t.skip('nvcc not found (set NVCC, put it on PATH, or install it at /usr/local/cuda/bin); cannot regenerate PTX');
    return;
  }
  const outDir = mkdtempSync(join(tmpdir(), 'cuda-ipc-ptx-'));
  try {
    const run = spawnSync('bash', [join(repoRoot, 'scripts/gen-ptx.sh'), '--out-dir', outDir], {
      env: { ...process.env, NVCC: nvcc },
      encoding: 'utf8',
    });
    assert.equal(run.status, 0, `gen-ptx.sh failed:\n${run.stderr}`);
    const sources = readdirSync(kernelsDir).filter((f) => f.endsWith('.cu')).map((f) => f.replace(/\.cu$/, '.ptx'));
    assert.deepEqual(ptxFilesIn(kernelsDir), sources.sort(), 'every kernels/*.cu needs its shipped .ptx, and no other .ptx');
    assert.deepEqual(ptxFilesIn(outDir), ptxFilesIn(kernelsDir));
    for (const file of ptxFilesIn(kernelsDir)) {
      const shipped = readFileSync(join(kernelsDir, file), 'utf8');
      const fresh = readFileSync(join(outDir, file), 'utf8');
      if (compilerHeader(shipped) === compilerHeader(fresh)) {
        assert.ok(shipped === fresh, `kernels/${file} is stale: run scripts/gen-ptx.sh and commit the result`);
      } else {
        // Another nvcc may generate different code from the same source; the entry points and
        // their parameters still have to agree.
        assert.deepEqual(
          parsePtxEntries(fresh),
          parsePtxEntries(shipped),
          `kernels/${file} declares other kernels than its source: run scripts/gen-ptx.sh and commit the result`,
        );
        t.diagnostic(
          `kernels/${file} was generated by another nvcc (${compilerHeader(shipped).replace(/\n/g, ' | ')}); ` +
            'compared entry points only, not bytes',
        );
      }
    }
  } finally {
    rmSync(outDir, { recursive: true, force: true });
  }
});

test('the shipped PTX assembles for the lowest target (ptxas)', (t) => {
  const nvcc = findNvcc();
  const ptxas = nvcc === undefined ? '' : join(dirname(nvcc), 'ptxas');
  if (!isExecutable(ptxas)) {
    t.skip('ptxas not found next to nvcc; cannot assemble the PTX');
    return;
  }
  const outDir = mkdtempSync(join(tmpdir(), 'cuda-ipc-ptxas-'));
  try {
    for (const file of ptxFilesIn(kernelsDir)) {
      const run = spawnSync(ptxas, ['-arch=sm_75', join(kernelsDir, file), '-o', join(outDir, 'out.cubin')], {
        encoding: 'utf8',
      });
      assert.equal(run.status, 0, `ptxas rejected kernels/${file}:\n${run.stderr}`);
    }
  } finally {
    rmSync(outDir, { recursive: true, force: true });
  }
});
