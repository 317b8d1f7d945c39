// The options both fuzz scripts take: --cases N (default 1,000,000), --seed S (default random),
// --first I (default 0); each a non-negative integer, else the script exits 2 saying which.
import { randomInt } from 'node:crypto';

function option(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const value = Number(process.argv[i + 1]);
  if (!Number.isSafeInteger(value) || value < 0) {
    console.error(`--${name} needs a non-negative integer, got ${process.argv[i + 1]}`);
    process.exit(2);
  }
  return value;
}

/** { cases, seed, first } from the command line. */
export function fuzzRange() {
  return {
    cases: option('cases', 1_000_000),
    seed: option('seed', randomInt(2 ** 32)) >>> 0,
    first: option('first', 0),
  };
}
