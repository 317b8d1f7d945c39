// float16 (IEEE 754 binary16) and bfloat16 conversions between JS numbers and 16-bit patterns.
// Encoding rounds the float64 value directly to nearest, ties to even: going through float32
// first would round twice and get some ties wrong. Subnormals, infinities and NaN are kept;
// NaN becomes the canonical quiet NaN of the format.

import { IpcError } from './errors.js';
import { invalidArgType, badNumber } from './arg-errors.js';

interface SmallFloatFormat {
  readonly mantissaBits: number;
  readonly exponentBits: number;
  readonly quietNaN: number;
}

const FLOAT16: SmallFloatFormat = { mantissaBits: 10, exponentBits: 5, quietNaN: 0x7e00 };
const BFLOAT16: SmallFloatFormat = { mantissaBits: 7, exponentBits: 8, quietNaN: 0x7fc0 };

/** Bits of the float16 nearest to `value` (ties to even); overflow gives ±Infinity. */
export function float16BitsFromNumber(value: number): number {
  return encode(value, FLOAT16);
}

/** The number a float16 bit pattern (0..0xffff) stands for. */
export function numberFromFloat16Bits(bits: number): number {
  return decode(bits, FLOAT16);
}

/** Bits of the bfloat16 nearest to `value` (ties to even); overflow gives ±Infinity. */
export function bfloat16BitsFromNumber(value: number): number {
  return encode(value, BFLOAT16);
}

/** The number a bfloat16 bit pattern (0..0xffff) stands for. */
export function numberFromBfloat16Bits(bits: number): number {
  return decode(bits, BFLOAT16);
}

const scratch = new DataView(new ArrayBuffer(8));

/** Unbiased binary exponent of a positive, normal float64 (exact, unlike Math.log2). */
function exponentOf(positive: number): number {
  scratch.setFloat64(0, positive);
  return ((scratch.getUint16(0) >>> 4) & 0x7ff) - 1023;
}

function roundHalfToEven(x: number): number {
  const floor = Math.floor(x);
  const rest = x - floor; // exact: x < 2^12 here
  if (rest > 0.5) return floor + 1;
  if (rest < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

function encode(value: number, fmt: SmallFloatFormat): number {
  if (typeof value !== 'number') {
    throw invalidArgType(`expected a number to convert, got ${typeof value}`);
  }
  const m = fmt.mantissaBits;
  const bias = (1 << (fmt.exponentBits - 1)) - 1;
  const infinityBits = ((1 << fmt.exponentBits) - 1) << m;
  if (Number.isNaN(value)) return fmt.quietNaN;
  const sign = value < 0 || Object.is(value, -0) ? 1 << (m + fmt.exponentBits) : 0;
  const magnitude = Math.abs(value);
  if (magnitude === Infinity) return sign | infinityBits;
  const minNormalExponent = 1 - bias;
  if (magnitude < 2 ** minNormalExponent) {
    // Subnormal (or zero): a count of the smallest step 2^(minNormalExponent - m). Scaling by a
    // power of two is exact; a result of 2^m lands on the smallest normal, which is correct.
    return sign | roundHalfToEven(magnitude * 2 ** (m - minNormalExponent));
  }
  const exponent = exponentOf(magnitude);
  if (exponent > bias) return sign | infinityBits;
  const significand = roundHalfToEven(magnitude * 2 ** (m - exponent)); // in [2^m, 2^(m+1)]
  // Adding (not or-ing) lets a rounding carry into the exponent, up to infinity.
  const bits = ((exponent + bias) << m) + significand - (1 << m);
  return sign | Math.min(bits, infinityBits);
}

function decode(bits: number, fmt: SmallFloatFormat): number {
  if (!Number.isInteger(bits) || bits < 0 || bits > 0xffff) {
    throw badNumber(bits, `a 16-bit pattern must be an integer in 0..0xffff, got ${String(bits)}`);
  }
  const m = fmt.mantissaBits;
  const bias = (1 << (fmt.exponentBits - 1)) - 1;
  const maxExponentField = (1 << fmt.exponentBits) - 1;
  const sign = bits >>> (m + fmt.exponentBits) ? -1 : 1;
  const exponentField = (bits >>> m) & maxExponentField;
  const mantissa = bits & ((1 << m) - 1);
  if (exponentField === maxExponentField) return mantissa === 0 ? sign * Infinity : NaN;
  if (exponentField === 0) return sign * mantissa * 2 ** (1 - bias - m);
  return sign * ((1 << m) + mantissa) * 2 ** (exponentField - bias - m);
}
