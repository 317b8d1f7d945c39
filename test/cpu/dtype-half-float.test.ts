import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  bfloat16BitsFromNumber,
  float16BitsFromNumber,
  numberFromBfloat16Bits,
  numberFromFloat16Bits,
} from '../../src/half-float.js';

const hex = (n: number) => '0x' + n.toString(16).padStart(4, '0');

test('float16 encodes known values', () => {
  const cases: Array<[number, number]> = [
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2.5, 0xc100],
    [0.1, 0x2e66],
    [65504, 0x7bff], // largest finite
    [65519.99, 0x7bff], // below the midpoint to 65536 stays finite
    [65520, 0x7c00], // the midpoint ties to even: infinity
    [2 ** -14, 0x0400], // smallest normal
    [6.1e-5, 0x03ff], // just below it: largest subnormal
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // half of it ties to even: zero
    [2 ** -25 * 1.0001, 0x0001],
    [3 * 2 ** -25, 0x0002], // 1.5 steps ties to 2
    [Infinity, 0x7c00],
    [-Infinity, 0xfc00],
    [1e300, 0x7c00],
    [-1e-300, 0x8000],
  ];
  for (const [value, bits] of cases) assert.equal(hex(float16BitsFromNumber(value)), hex(bits), String(value));
  assert.equal(hex(float16BitsFromNumber(NaN)), '0x7e00');
});

test('float16 rounds to nearest with ties to even', () => {
  assert.equal(hex(float16BitsFromNumber(1 + 2 ** -11)), '0x3c00'); // tie, 1.0 is even
  assert.equal(hex(float16BitsFromNumber(1 + 3 * 2 ** -11)), '0x3c02'); // tie, rounds up to even
  assert.equal(hex(float16BitsFromNumber(2049)), hex(float16BitsFromNumber(2048)));
  assert.equal(numberFromFloat16Bits(float16BitsFromNumber(2051)), 2052);
  // Rounding through float32 first would turn this into the tie 1 + 2^-11 and give 1.0.
  assert.equal(hex(float16BitsFromNumber(1 + 2 ** -11 + 2 ** -40)), '0x3c01');
  // A carry out of the mantissa moves to the next binade.
  assert.equal(numberFromFloat16Bits(float16BitsFromNumber(2047.9)), 2048);
});

test('float16 decodes known patterns', () => {
  assert.equal(numberFromFloat16Bits(0x3c00), 1);
  assert.equal(numberFromFloat16Bits(0xc100), -2.5);
  assert.equal(numberFromFloat16Bits(0x7bff), 65504);
  assert.equal(numberFromFloat16Bits(0x03ff), 1023 * 2 ** -24);
  assert.equal(numberFromFloat16Bits(0x0001), 2 ** -24);
  assert.equal(Object.is(numberFromFloat16Bits(0x8000), -0), true);
  assert.equal(numberFromFloat16Bits(0x7c00), Infinity);
  assert.equal(numberFromFloat16Bits(0xfc00), -Infinity);
  assert.equal(Number.isNaN(numberFromFloat16Bits(0x7c01)), true);
  assert.equal(Number.isNaN(numberFromFloat16Bits(0xfe00)), true);
  assert.throws(() => numberFromFloat16Bits(0x10000), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' });
  assert.throws(() => numberFromFloat16Bits(1.5), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' });
});

/** Independent oracle: the nearest finite pattern by search over all positive patterns, ties to
 *  the even mantissa, overflow past max + half an ulp to infinity. */
function nearestBySearch(value: number, decode: (b: number) => number, maxFinite: number): number {
  const sign = value < 0 || Object.is(value, -0) ? 0x8000 : 0;
  const a = Math.abs(value);
  let lo = 0;
  let hi = maxFinite;
  while (hi - lo > 1) {
    const mid = (lo + hi) >>> 1;
    if (decode(mid) <= a) lo = mid;
    else hi = mid;
  }
  if (a >= decode(maxFinite)) {
    const halfUlp = (decode(maxFinite) - decode(maxFinite - 1)) / 2;
    if (a - decode(maxFinite) < halfUlp) return sign | maxFinite;
    return sign | (maxFinite + 1);
  }
  const dLo = a - decode(lo);
  const dHi = decode(hi) - a;
  const pick = dLo < dHi ? lo : dHi < dLo ? hi : lo % 2 === 0 ? lo : hi;
  return sign | pick;
}

test('float16 and bfloat16 agree with a brute-force nearest search on random values', () => {
  let state = 0x9e3779b9;
  const rand = () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
  for (let i = 0; i < 20000; i++) {
    const f16 = (rand() - 0.5) * 2 ** Math.floor(rand() * 46 - 28);
    assert.equal(hex(float16BitsFromNumber(f16)), hex(nearestBySearch(f16, numberFromFloat16Bits, 0x7bff)), String(f16));
    // Exact midpoints between neighbours stress the tie rule.
    const b = Math.floor(rand() * 0x7bff);
    const mid = (numberFromFloat16Bits(b) + numberFromFloat16Bits(b + 1)) / 2;
    assert.equal(hex(float16BitsFromNumber(mid)), hex(b % 2 === 0 ? b : b + 1), `midpoint ${mid}`);
    const bf = (rand() - 0.5) * 2 ** Math.floor(rand() * 280 - 140);
    assert.equal(hex(bfloat16BitsFromNumber(bf)), hex(nearestBySearch(bf, numberFromBfloat16Bits, 0x7f7f)), String(bf));
  }
});

test('every finite float16 and bfloat16 pattern survives decode then encode', () => {
  for (let bits = 0; bits <= 0xffff; bits++) {
    const f16 = numberFromFloat16Bits(bits);
    if (!Number.isNaN(f16)) assert.equal(float16BitsFromNumber(f16), bits, hex(bits));
    const bf = numberFromBfloat16Bits(bits);
    if (!Number.isNaN(bf)) assert.equal(bfloat16BitsFromNumber(bf), bits, hex(bits));
  }
});

test('bfloat16 matches float32 truncation with round-to-nearest-even on float32 inputs', () => {
  const view = new DataView(new ArrayBuffer(4));
  let x = 0x12345678;
  for (let i = 0; i < 20000; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    view.setUint32(0, x);
    const f = view.getFloat32(0);
    if (Number.isNaN(f)) continue;
    const reference = ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff; // the usual float32 -> bf16 RNE
    assert.equal(hex(bfloat16BitsFromNumber(f)), hex(reference), `float32 bits 0x${x.toString(16)}`);
  }
});

test('bfloat16 encodes and decodes known values', () => {
  const cases: Array<[number, number]> = [
    [1, 0x3f80],
    [-2.5, 0xc020],
    [3.140625, 0x4049],
    [65504, 0x4780], // not representable: rounds up to 65536
    [2 ** -126, 0x0080], // smallest normal
    [2 ** -133, 0x0001], // smallest subnormal
    [Infinity, 0x7f80],
    [-Infinity, 0xff80],
    [3.4e38, 0x7f80], // beyond max finite + half ulp
  ];
  for (const [value, bits] of cases) assert.equal(hex(bfloat16BitsFromNumber(value)), hex(bits), String(value));
  assert.equal(hex(bfloat16BitsFromNumber(NaN)), '0x7fc0');
  assert.equal(numberFromBfloat16Bits(0x7f7f), 3.3895313892515355e38);
  assert.equal(numberFromBfloat16Bits(0x0001), 2 ** -133);
  assert.equal(hex(bfloat16BitsFromNumber(1 + 2 ** -8)), '0x3f80'); // tie to even
  assert.equal(hex(bfloat16BitsFromNumber(1 + 3 * 2 ** -8)), '0x3f82');
  assert.equal(Number.isNaN(numberFromBfloat16Bits(0x7f81)), true);
});
