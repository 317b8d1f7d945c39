// Matchers for Node-style argument errors (src/arg-errors.ts): a TypeError with code
// ERR_INVALID_ARG_TYPE / ERR_INVALID_ARG_VALUE, or a RangeError with code ERR_OUT_OF_RANGE.
import assert from 'node:assert/strict';

export type ArgCode = 'ERR_INVALID_ARG_TYPE' | 'ERR_INVALID_ARG_VALUE' | 'ERR_OUT_OF_RANGE';
const CODES: readonly string[] = ['ERR_INVALID_ARG_TYPE', 'ERR_INVALID_ARG_VALUE', 'ERR_OUT_OF_RANGE'];

/** For assert.throws / rejects: the argument error `code` (any of the three when omitted), whose message matches `message`. */
export function argError(code?: ArgCode, message?: RegExp): (e: unknown) => true {
  return (e: unknown) => {
    const c = (e as { code?: unknown })?.code;
    assert.ok(typeof c === 'string' && CODES.includes(c), `expected an argument error, got ${String((e as Error)?.stack ?? e)}`);
    if (code !== undefined) assert.equal(c, code);
    if (c === 'ERR_OUT_OF_RANGE') assert.ok(e instanceof RangeError, `${c} must be a RangeError: ${String(e)}`);
    else assert.ok(e instanceof TypeError, `${c} must be a TypeError: ${String(e)}`);
    if (message) assert.match((e as Error).message, message);
    return true;
  };
}
