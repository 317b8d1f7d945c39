// Lower-case hex text for raw handle bytes: what Python's bytes.hex() writes and
// bytes.fromhex() reads. Decoding is strict (exact length, lower-case digits only) so that every
// byte string has exactly one text form and descriptors round-trip byte for byte.

import { describe, fail, type Field } from './checks.js';

const DIGITS = '0123456789abcdef';

export function bytesToHex(bytes: Uint8Array): string {
  let text = '';
  for (const byte of bytes) text += DIGITS[byte >>> 4]! + DIGITS[byte & 15]!;
  return text;
}

/** Parses exactly `byteLength` bytes of lower-case hex. */
export function hexToBytes(value: unknown, byteLength: number, field: Field): Uint8Array {
  const chars = byteLength * 2;
  if (typeof value !== 'string') fail(field, `must be a string of ${chars} lower-case hex digits, got ${describe(value)}`);
  if (value.length !== chars) fail(field, `must be exactly ${chars} hex digits (${byteLength} bytes), got ${value.length} characters`);
  const bytes = new Uint8Array(byteLength);
  for (let i = 0; i < byteLength; i++) {
    const hi = digitValue(value.charCodeAt(2 * i));
    const lo = digitValue(value.charCodeAt(2 * i + 1));
    if (hi < 0 || lo < 0) {
      const at = hi < 0 ? 2 * i : 2 * i + 1;
      fail(field, `has ${describe(value[at])} at index ${at}; use lower-case hex digits 0-9a-f only (Python: bytes.hex())`);
    }
    bytes[i] = (hi << 4) | lo;
  }
  return bytes;
}

function digitValue(code: number): number {
  if (code >= 0x30 && code <= 0x39) return code - 0x30; // 0-9
  if (code >= 0x61 && code <= 0x66) return code - 0x61 + 10; // a-f
  return -1;
}
