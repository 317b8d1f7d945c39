// Waiting for what a test waits for: a condition or a promise, with a generous deadline that fails
// loudly naming what never came. Never a sleep standing in for an event, never a duration asserted.
import assert from 'node:assert/strict';

/** Resolves once `check()` holds (polled every few ms); fails the test after `ms` naming `what`. */
export async function waitUntil(check: () => boolean, what: string, ms = 30_000): Promise<void> {
  const until = Date.now() + ms;
  while (!check()) {
    if (Date.now() > until) assert.fail(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** `promise`, or a failure naming `what` if it has not settled within `ms`. */
export async function within<T>(promise: Promise<T>, what: string, ms = 30_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}
