// Argument errors the way Node's own APIs throw them: a TypeError or RangeError with a `code`
// (ERR_INVALID_ARG_TYPE, ERR_INVALID_ARG_VALUE, ERR_OUT_OF_RANGE, ERR_INVALID_URL). IpcError stays for what goes
// wrong between processes; a call that was given a bad argument throws one of these, at once.

export type ArgErrorCode = 'ERR_INVALID_ARG_TYPE' | 'ERR_INVALID_ARG_VALUE' | 'ERR_OUT_OF_RANGE' | 'ERR_INVALID_URL';

/** A TypeError or RangeError carrying Node's `code`, named like Node's ("TypeError"). */
export interface ArgError extends Error {
  readonly code: ArgErrorCode;
}

function withCode<E extends Error>(error: E, code: ArgErrorCode): E & ArgError {
  Object.defineProperty(error, 'code', { value: code, enumerable: true, writable: true, configurable: true });
  return error as E & ArgError;
}

type ErrorOptions = { cause?: unknown };

/** The argument is of the wrong type (a string where a number belongs, ...): TypeError. */
export function invalidArgType(message: string, options?: ErrorOptions): TypeError & ArgError {
  return withCode(new TypeError(message, options), 'ERR_INVALID_ARG_TYPE');
}

/** The argument has the right type but a value the call does not accept: TypeError. */
export function invalidArgValue(message: string, options?: ErrorOptions): TypeError & ArgError {
  return withCode(new TypeError(message, options), 'ERR_INVALID_ARG_VALUE');
}

/** A link URL that is not one (link-url.ts): TypeError, as Node's own `new URL()` throws. */
export function invalidUrl(message: string, options?: ErrorOptions): TypeError & ArgError {
  return withCode(new TypeError(message, options), 'ERR_INVALID_URL');
}

/** A number outside the range the call accepts (too big, negative, not an integer): RangeError. */
export function outOfRange(message: string, options?: ErrorOptions): RangeError & ArgError {
  return withCode(new RangeError(message, options), 'ERR_OUT_OF_RANGE');
}

/** The error for a number argument that is not an integer in range: TypeError when it is no number at all. */
export function badNumber(value: unknown, message: string): (TypeError | RangeError) & ArgError {
  return typeof value === 'number' || typeof value === 'bigint' ? outOfRange(message) : invalidArgType(message);
}

/** `value` as a readable fragment for messages: `Received type string ('x')`, as Node says it. */
export function received(value: unknown): string {
  if (value === null) return 'Received null';
  if (value === undefined) return 'Received undefined';
  if (typeof value === 'function') return `Received function ${value.name || '<anonymous>'}`;
  if (typeof value === 'object') {
    const name = (value as object).constructor?.name;
    return name ? `Received an instance of ${name}` : 'Received an object';
  }
  let shown = typeof value === 'bigint' ? `${value}n` : typeof value === 'string' ? `'${value.length > 28 ? `${value.slice(0, 25)}...` : value}'` : String(value);
  if (typeof value === 'symbol') shown = value.toString();
  return `Received type ${typeof value} (${shown})`;
}

/**
 * Checks that `value` is an integer in [min, max] (a safe integer by default):
 * ERR_INVALID_ARG_TYPE for a non-number, ERR_OUT_OF_RANGE for NaN, fractions and numbers outside.
 */
export function checkInteger(value: unknown, name: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== 'number') throw invalidArgType(`The "${name}" argument must be of type number. ${received(value)}`);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw outOfRange(`The value of "${name}" is out of range. It must be an integer >= ${min} && <= ${max}. Received ${String(value)}`);
  }
  return value;
}

/** Like checkInteger, for an option that may be left out: `fallback` when undefined. */
export function optionalInteger(value: unknown, name: string, fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  return value === undefined ? fallback : checkInteger(value, name, min, max);
}

/** Checks that `value` is an object (or undefined, when `optional`): ERR_INVALID_ARG_TYPE otherwise. */
export function checkObject<T extends object>(value: unknown, name: string): T | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'object' || value === null) throw invalidArgType(`The "${name}" argument must be of type object. ${received(value)}`);
  return value as T;
}

/** Checks an optional AbortSignal option: ERR_INVALID_ARG_TYPE when it is something else. */
export function checkSignal(value: unknown, name = 'options.signal'): AbortSignal | undefined {
  if (value === undefined) return undefined;
  if (!(value instanceof AbortSignal)) throw invalidArgType(`The "${name}" property must be an instance of AbortSignal. ${received(value)}`);
  return value;
}

function distance(a: string, b: string): number {
  const d = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = d[0]!;
    d[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = d[j]!;
      d[j] = Math.min(d[j]! + 1, d[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return d[b.length]!;
}

/** The known name closest to `name`, if it is close enough to be a typo. */
export function closest(name: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestD = Infinity;
  for (const k of known) {
    const d = k.startsWith(name) && name.length >= 2 ? 0 : distance(name, k);
    if (d < bestD) {
      bestD = d;
      best = k;
    }
  }
  return bestD <= Math.max(1, Math.floor(name.length / 3)) ? best : undefined;
}

/**
 * Checks that `options` has only the keys of `known` (a record over the options type's keys, so
 * that the compiler keeps it complete): a misspelt or misplaced option from JavaScript would
 * otherwise be ignored without a word. TypeError ERR_INVALID_ARG_VALUE naming the key and what it
 * may have meant (`hints[key]`, else the closest known key). Keys set to undefined pass.
 */
export function checkOptionKeys(options: unknown, known: Readonly<Record<string, true>>, what: string, hints: Readonly<Record<string, string>> = {}): void {
  if (typeof options !== 'object' || options === null) return;
  for (const [key, value] of Object.entries(options)) {
    if (Object.hasOwn(known, key) || value === undefined) continue;
    const names = Object.keys(known);
    const guess = closest(key, names);
    const why = Object.hasOwn(hints, key) ? `: ${hints[key]}` : guess ? ` (did you mean '${guess}'?)` : '';
    throw invalidArgValue(`${what}: unknown option '${key}'${why}; the options are ${names.join(', ')}`);
  }
}
