import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  arg,
  checkKernelArgs,
  kernelArgLayout,
  packKernelArgs,
  type KernelArg,
} from '../../src/cuda/kernel-args.js';
import { IpcError } from '../../src/errors.js';

function invalidArg(pattern: RegExp) {
  return (error: unknown) => {
    assert.ok(error instanceof TypeError, `expected a TypeError, got ${String(error)}`);
    assert.ok(['ERR_INVALID_ARG_VALUE', 'ERR_INVALID_ARG_TYPE'].includes((error as { code?: string }).code!));
    assert.match(error.message, pattern);
    return true;
  };
}

function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString('hex');
}

test('mixed arguments sit at their natural alignment, total padded to the largest', () => {
  const args = [
    arg.u8(0xab),
    arg.ptr(0x0123_4567_89ab_cdefn),
    arg.f32(-2.5),
    arg.u64(0xfedc_ba98_7654_3210n),
    arg.i16(-2),
  ];
  assert.deepEqual(kernelArgLayout(args.map((a) => a.type)), { offsets: [0, 8, 16, 24, 32], size: 40 });
  const bytes = packKernelArgs(args);
  assert.equal(
    hex(bytes),
    'ab00000000000000' + // u8, then padding to 8
      'efcdab8967452301' + // ptr
      '000020c000000000' + // f32 -2.5 = 0xc0200000, then padding to 8
      '1032547698badcfe' + // u64
      'feff000000000000', // i16 -2, then padding to a multiple of 8
  );
});

test('layouts of small types pack tightly and pad only to their own largest alignment', () => {
  assert.deepEqual(kernelArgLayout(['i8', 'i16', 'i32', 'i8']), { offsets: [0, 2, 4, 8], size: 12 });
  assert.deepEqual(kernelArgLayout(['u8', 'u8', 'u16']), { offsets: [0, 1, 2], size: 4 });
  assert.deepEqual(kernelArgLayout(['f16', 'bf16', 'u8']), { offsets: [0, 2, 4], size: 6 });
  assert.deepEqual(kernelArgLayout(['u32', 'f64', 'u8']), { offsets: [0, 8, 16], size: 24 });
  assert.deepEqual(kernelArgLayout([]), { offsets: [], size: 0 });
  assert.equal(packKernelArgs([]).byteLength, 0);
});

test('values are written little-endian with their exact bit patterns', () => {
  const cases: Array<[KernelArg, string]> = [
    [arg.u32(0x0102_0304), '04030201'],
    [arg.i32(-2), 'feffffff'],
    [arg.i32(-0x8000_0000), '00000080'],
    [arg.u16(0xbeef), 'efbe'],
    [arg.i8(-128), '80'],
    [arg.i64(-1n), 'ffffffffffffffff'],
    [arg.i64(-(1n << 63n)), '0000000000000080'],
    [arg.u64((1n << 64n) - 1n), 'ffffffffffffffff'],
    [arg.f32(1), '0000803f'],
    [arg.f64(1), '000000000000f03f'],
    [arg.f64(-0), '0000000000000080'],
    [arg.f32(Number.NaN), '0000c07f'],
    [arg.f32(Number.POSITIVE_INFINITY), '0000807f'],
    [arg.f32(1e40), '0000807f'], // rounds to infinity, as a C float would
  ];
  for (const [a, expected] of cases) {
    assert.equal(hex(packKernelArgs([a])), expected, `${a.type} ${String(a.value)}`);
  }
});

test('a pointer can come from anything with a bigint devicePointer', () => {
  const buffer = { devicePointer: 0x7f00_1234_5678n, byteLength: 4096 };
  assert.deepEqual(arg.ptr(buffer), { type: 'ptr', value: 0x7f00_1234_5678n });
  // Also when handed straight to packKernelArgs.
  assert.equal(hex(packKernelArgs([{ type: 'ptr', value: buffer }])), '78563412007f0000');
  assert.equal(hex(packKernelArgs([arg.ptr(0n)])), '0000000000000000'); // null is a legal pointer
});

test('builders reject values their type cannot hold, naming the builder and the value', () => {
  assert.throws(() => arg.i8(128), invalidArg(/arg\.i8\(\): 128 is outside the i8 range -128\.\.127/));
  assert.throws(() => arg.u8(-1), invalidArg(/arg\.u8\(\): -1 is outside the u8 range 0\.\.255/));
  assert.throws(() => arg.i16(0x8000), invalidArg(/outside the i16 range/));
  assert.throws(() => arg.u16(0x1_0000), invalidArg(/outside the u16 range/));
  assert.throws(() => arg.u32(2 ** 32), invalidArg(/4294967296 is outside the u32 range 0\.\.4294967295/));
  assert.throws(() => arg.i32(2 ** 31), invalidArg(/outside the i32 range/));
  assert.throws(() => arg.i32(1.5), invalidArg(/i32 values must be integer numbers, got 1\.5/));
  assert.throws(() => arg.u32(Number.NaN), invalidArg(/integer numbers, got NaN/));
  assert.throws(() => arg.u64(-1n), invalidArg(/-1n is outside the u64 range/));
  assert.throws(() => arg.i64(1n << 63n), invalidArg(/9223372036854775808n is outside the i64 range/));
  assert.throws(() => arg.u64(5 as unknown as bigint), invalidArg(/u64 values must be bigint \(write 5n\), got 5/));
  assert.throws(() => arg.ptr(4096 as unknown as bigint), invalidArg(/device pointer must be a bigint/));
  assert.throws(() => arg.ptr(1n << 64n), invalidArg(/outside 0\.\.2\^64-1/));
  assert.throws(() => arg.ptr({ devicePointer: 5 as unknown as bigint }), invalidArg(/got 5$/));
  assert.throws(() => arg.f32('1' as unknown as number), invalidArg(/f32 values must be numbers, got "1"/));
});

test('packKernelArgs checks hand-built arguments and names the index, type and value', () => {
  assert.throws(
    () => packKernelArgs([arg.u8(1), { type: 'u32', value: -1 }]),
    invalidArg(/^kernel argument 1 \(u32, value -1\): -1 is outside the u32 range/),
  );
  assert.throws(
    () => packKernelArgs([arg.ptr(0n), arg.u64(1n), { type: 'i64', value: 3 as unknown as bigint }]),
    invalidArg(/^kernel argument 2 \(i64, value 3\): i64 values must be bigint/),
  );
  assert.throws(
    () => packKernelArgs([{ type: 'u128', value: 1n } as unknown as KernelArg]),
    invalidArg(/^kernel argument 0 must be a typed argument.*with type "u128"/),
  );
  assert.throws(() => packKernelArgs([5 as unknown as KernelArg]), invalidArg(/^kernel argument 0 must be a typed argument/));
  assert.throws(() => kernelArgLayout(['u8', 'int' as never]), invalidArg(/kernel argument 1: unknown type "int"/));
});

function f16Bits(value: number): number {
  return new DataView(packKernelArgs([arg.f16(value)]).buffer).getUint16(0, true);
}

function bf16Bits(value: number): number {
  return new DataView(packKernelArgs([arg.bf16(value)]).buffer).getUint16(0, true);
}

test('f16 arguments are IEEE binary16, rounded to nearest with ties to even', () => {
  const cases: Array<[number, number]> = [
    [1, 0x3c00],
    [-2, 0xc000],
    [0.1, 0x2e66],
    [1 / 3, 0x3555],
    [65504, 0x7bff], // largest finite
    [65519.99, 0x7bff],
    [65520, 0x7c00], // halfway to 65536: ties to even overflow to infinity
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // halfway to the smallest subnormal: ties to even, zero
    [3 * 2 ** -25, 0x0002], // 1.5 subnormal steps: ties to even, 2
    [2 ** -14, 0x0400], // smallest normal
    [2 ** -14 - 2 ** -25, 0x0400], // halfway between largest subnormal (odd) and smallest normal
    [6.1e-5, 0x03ff],
    [1 + 2 ** -11, 0x3c00], // halfway between 1 and the next: ties to even
    [1 + 3 * 2 ** -11, 0x3c02],
    [1e-8, 0x0000],
    [-0, 0x8000],
    [Number.POSITIVE_INFINITY, 0x7c00],
    [Number.NEGATIVE_INFINITY, 0xfc00],
    [Number.NaN, 0x7e00],
    [1e300, 0x7c00],
  ];
  for (const [value, bits] of cases) {
    assert.equal(f16Bits(value).toString(16), bits.toString(16), `f16(${value})`);
  }
});

test('bf16 arguments round the double directly, to nearest with ties to even', () => {
  const cases: Array<[number, number]> = [
    [1, 0x3f80],
    [-2, 0xc000],
    [Math.PI, 0x4049],
    [0.1, 0x3dcd],
    [3.3895313892515355e38, 0x7f7f], // largest finite
    [(2 - 2 ** -8) * 2 ** 127, 0x7f80], // halfway past the largest finite: ties to even, infinity
    [3.4028234663852886e38, 0x7f80], // float32's largest finite is beyond bf16's
    [2 ** -133, 0x0001], // smallest subnormal
    [2 ** -134, 0x0000],
    [2 ** -126, 0x0080], // smallest normal
    [1 + 2 ** -8, 0x3f80], // halfway: ties to even
    [1 + 3 * 2 ** -8, 0x3f82],
    // Just above halfway. Rounding through float32 first would land exactly on the tie and
    // round down to 0x3f80; the direct rounding sees it is above and rounds up.
    [1 + 2 ** -8 + 2 ** -30, 0x3f81],
    [-0, 0x8000],
    [Number.NEGATIVE_INFINITY, 0xff80],
    [Number.NaN, 0x7fc0],
  ];
  for (const [value, bits] of cases) {
    assert.equal(bf16Bits(value).toString(16), bits.toString(16), `bf16(${value})`);
  }
});

const fillF32 = {
  name: 'fill_pattern_f32',
  params: [
    { name: 'out', type: 'ptr' },
    { name: 'n', type: 'u64' },
    { name: 'a', type: 'f32' },
    { name: 'b', type: 'f32' },
  ],
} as const;

test('checkKernelArgs accepts arguments matching the declared parameters', () => {
  assert.doesNotThrow(() => checkKernelArgs(fillF32, [arg.ptr(16n), arg.u64(4n), arg.f32(1), arg.f32(0.5)]));
});

test('checkKernelArgs rejects a wrong count or type with the expected signature', () => {
  assert.throws(
    () => checkKernelArgs(fillF32, [arg.ptr(16n), arg.u64(4n), arg.f32(1)]),
    invalidArg(/^kernel fill_pattern_f32\(ptr out, u64 n, f32 a, f32 b\) takes 4 arguments, got 3/),
  );
  assert.throws(
    () => checkKernelArgs(fillF32, [arg.ptr(16n), arg.u32(4), arg.f32(1), arg.f32(0.5)]),
    invalidArg(/argument 1 \(n\) must be u64, got "u32"; build it with arg\.u64\(\.\.\.\)/),
  );
  assert.throws(
    () => checkKernelArgs(fillF32, [arg.ptr(16n), arg.u64(4n), arg.f64(1), arg.f32(0.5)]),
    invalidArg(/argument 2 \(a\) must be f32, got "f64"/),
  );
});
