// Field checks for untrusted input. Each names the offending field by its path (e.g.
// `descriptor.array.shape[2]`) and throws an IpcError with the caller's code, so the same checks
// serve descriptors (ERR_DESCRIPTOR_INVALID); for direct API arguments (code ARG) they throw
// Node's argument errors (TypeError / RangeError, arg-errors.ts).

import { IpcError, type IpcErrorCode } from '../errors.js';
import { invalidArgType, invalidArgValue, outOfRange } from '../arg-errors.js';

/** The code of a Field that is a direct API argument: failures are TypeError / RangeError. */
export const ARG = 'ERR_INVALID_ARG_VALUE';

/** Where a value came from: the error code to throw and the field path to name. */
export interface Field {
  readonly code: IpcErrorCode | typeof ARG;
  readonly path: string;
}

export function at(field: Field, key: string | number): Field {
  return { code: field.code, path: typeof key === 'number' ? `${field.path}[${key}]` : `${field.path}.${key}` };
}

/** Throws for `field`; `kind` picks the argument error (a wrong type, a bad value, a number out of range). */
export function fail(field: Field, problem: string, kind: 'type' | 'value' | 'range' = 'value'): never {
  const message = `${field.path} ${problem}`;
  if (field.code === ARG) throw kind === 'type' ? invalidArgType(message) : kind === 'range' ? outOfRange(message) : invalidArgValue(message);
  throw new IpcError(field.code, message);
}

const numberKind = (value: unknown): 'type' | 'range' => (typeof value === 'number' ? 'range' : 'type');

/** A short, bounded rendering of an untrusted value for error messages. */
export function describe(value: unknown): string {
  if (typeof value === 'string') {
    return value.length > 48 ? `${JSON.stringify(value.slice(0, 48))}... (${value.length} chars)` : JSON.stringify(value);
  }
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') {
    return Object.is(value, -0) ? '-0' : String(value);
  }
  if (value === null) return 'null';
  if (Array.isArray(value)) return `an array of length ${value.length}`;
  if (ArrayBuffer.isView(value)) return `a ${value.constructor.name} of ${value.byteLength} bytes`;
  return typeof value === 'object' ? 'an object' : typeof value;
}

/** A non-negative safe integer, with -0 normalised to 0 (so round trips compare equal). */
export function checkCount(value: unknown, field: Field, hint = ''): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    fail(field, `must be a non-negative safe integer (0..2^53-1), got ${describe(value)}${hint}`, numberKind(value));
  }
  return value + 0;
}

/** A safe integer in [min, max]. */
export function checkIntInRange(value: unknown, min: number, max: number, field: Field, hint = ''): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    fail(field, `must be an integer in ${min}..${max}, got ${describe(value)}${hint}`, numberKind(value));
  }
  return value + 0;
}

/** A plain data object (from JSON.parse or an object literal), not an array, class instance or null. */
export function checkPlainObject(value: unknown, field: Field): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    fail(field, `must be an object, got ${describe(value)}`, 'type');
  }
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) fail(field, `must be a plain object, got ${describe(value)}`);
  return value as Record<string, unknown>;
}

/** Rejects keys outside `required` and `optional`, then reports the first missing (or
 *  undefined) key of `required`. */
export function checkKeys(
  obj: Record<string, unknown>,
  required: readonly string[],
  optional: readonly string[],
  field: Field,
): void {
  for (const key of Object.keys(obj)) {
    if (!required.includes(key) && !optional.includes(key)) {
      // describe() bounds and escapes the key: it is untrusted text.
      fail(field, `has an unknown field ${describe(key)}; this version accepts only: ${[...required, ...optional].join(', ')}`);
    }
  }
  for (const key of required) {
    if (obj[key] === undefined) fail(at(field, key), 'is missing');
  }
}

/** An array of bounded length; the bound is checked before anything reads the elements. */
export function checkArray(value: unknown, maxLength: number, field: Field): readonly unknown[] {
  if (!Array.isArray(value)) fail(field, `must be an array, got ${describe(value)}`, 'type');
  if (value.length > maxLength) fail(field, `must have at most ${maxLength} entries, got ${value.length}`);
  return value;
}

/** Exactly `length` bytes in a Uint8Array; returns a private copy so later changes to the
 *  caller's buffer cannot alter a validated descriptor. */
export function checkBytes(value: unknown, length: number, field: Field): Uint8Array {
  if (!(value instanceof Uint8Array)) fail(field, `must be a Uint8Array of ${length} bytes, got ${describe(value)}`, 'type');
  if (value.byteLength !== length) fail(field, `must be exactly ${length} bytes, got ${value.byteLength}`);
  return new Uint8Array(value);
}
