import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import {
  BUILTIN_KERNELS,
  builtinPtxUrl,
  expectedPatternValue,
  getBuiltinKernel,
  referenceChecksum,
  type BuiltinKernelName,
} from '../../src/cuda/builtin-kernels.js';
import { arg, checkKernelArgs, kernelArgLayout, type KernelArg, type KernelArgType } from '../../src/cuda/kernel-args.js';

test('built-in kernel names are unique and each can be looked up', () => {
  const names = BUILTIN_KERNELS.map((k) => k.name);
  assert.equal(new Set(names).size, names.length);
  assert.equal(names.length, 21);
  for (const name of names) assert.equal(getBuiltinKernel(name).name, name);
});

test('an unknown kernel name is an ERR_INVALID_ARG_VALUE TypeError that lists the real ones', () => {
  assert.throws(
    () => getBuiltinKernel('fill_pattern_f16' as BuiltinKernelName),
    (error: unknown) =>
      error instanceof TypeError &&
      (error as { code?: string }).code === 'ERR_INVALID_ARG_VALUE' &&
      /no built-in kernel is named "fill_pattern_f16"; the built-in kernels are fill_pattern_i32, /.test(error.message),
  );
});

test('the shipped PTX file is where builtinPtxUrl points', () => {
  for (const kernel of BUILTIN_KERNELS) {
    const path = fileURLToPath(builtinPtxUrl(kernel.ptxFile));
    assert.ok(existsSync(path), `${kernel.name}: ${path} does not exist`);
  }
});

function sampleArg(type: KernelArgType): KernelArg {
  switch (type) {
    case 'ptr':
      return arg.ptr(0x1000n);
    case 'i64':
    case 'u64':
      return { type, value: 1n };
    default:
      return { type, value: 1 };
  }
}

test('argument buffers of the built-in kernels have the layouts their C signatures imply', () => {
  const layout = (name: BuiltinKernelName) => kernelArgLayout(getBuiltinKernel(name).params.map((p) => p.type));
  // (int*, u64, int, int, u64*, u64*)
  assert.deepEqual(layout('verify_pattern_i32'), { offsets: [0, 8, 16, 20, 24, 32], size: 40 });
  // (double*, u64, double)
  assert.deepEqual(layout('scale_f64'), { offsets: [0, 8, 16], size: 24 });
  // (float*, u64, float, float)
  assert.deepEqual(layout('fill_pattern_f32'), { offsets: [0, 8, 16, 20], size: 24 });
  // (unsigned*, unsigned, u64)
  assert.deepEqual(layout('spin_then_write_u32'), { offsets: [0, 8, 16], size: 24 });
  assert.deepEqual(layout('spin'), { offsets: [0], size: 8 });
  for (const kernel of BUILTIN_KERNELS) {
    assert.doesNotThrow(() => checkKernelArgs(kernel, kernel.params.map((p) => sampleArg(p.type))), kernel.name);
  }
});

test('integer patterns wrap modulo 2^bits', () => {
  assert.equal(expectedPatternValue('i32', 0x7fff_ffff, 1, 1), -0x8000_0000);
  assert.equal(expectedPatternValue('i32', -5, -3, 4), -17);
  assert.equal(expectedPatternValue('u32', 0, 0xffff_ffff, 2), 0xffff_fffe);
  assert.equal(expectedPatternValue('u64', 1n, (1n << 64n) - 1n, 3), (1n << 64n) - 2n);
  assert.equal(expectedPatternValue('i64', (1n << 63n) - 1n, 1n, 1), -(1n << 63n));
});

test('float patterns round each operation separately, as the kernels do', () => {
  // float32: 0.1f + 3 * 0.1f, each step rounded to float32 (checked against numpy).
  assert.equal(expectedPatternValue('f32', 0.1, 0.1, 3), 0.4000000059604645);
  assert.equal(expectedPatternValue('f64', 0.1, 0.1, 3), 0.4);
  assert.equal(expectedPatternValue('f64', 0.5, 0.25, 1000), 250.5);
  assert.throws(() => expectedPatternValue('f32', 0, 1, -1), /non-negative safe integer/);
});

test('referenceChecksum sums bytes and index-weighted bytes', () => {
  assert.deepEqual(referenceChecksum(new Uint8Array([1, 2, 3])), { byteSum: 6n, weightedSum: 14n });
  assert.deepEqual(referenceChecksum(new Uint8Array(0)), { byteSum: 0n, weightedSum: 0n });
  // Byte order matters to the weighted sum only.
  assert.deepEqual(referenceChecksum(new Uint8Array([3, 2, 1])), { byteSum: 6n, weightedSum: 10n });
  // Across the internal chunk boundary: n bytes of 255 give 255*n and 255*n*(n+1)/2.
  const n = (1 << 16) * 3 + 5;
  const full = referenceChecksum(new Uint8Array(n).fill(255));
  assert.equal(full.byteSum, 255n * BigInt(n));
  assert.equal(full.weightedSum, (255n * BigInt(n) * BigInt(n + 1)) / 2n);
});
