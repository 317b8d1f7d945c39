// The command lines of the bench scripts: parseArgs with --help, and a bad option answered with
// the usage (exit 2) instead of a stack trace.
import { parseArgs, type ParseArgsConfig } from 'node:util';

type Values<O extends Options> = ReturnType<typeof parseArgs<{ options: O }>>['values'];
type Options = NonNullable<ParseArgsConfig['options']>;

/** `options` parsed from `args` (default: the command line); `-h`/`--help` prints `usage` and exits
 * 0, an unknown or malformed option prints what was wrong and `usage` and exits 2. */
export function benchArgs<O extends Options>(tool: string, usage: string, options: O, args: string[] = process.argv.slice(2)): Values<O> {
  let values: Record<string, unknown>;
  try {
    ({ values } = parseArgs({ args, options: { ...options, help: { type: 'boolean', short: 'h' } } }));
  } catch (e) {
    console.error(`${tool}: ${(e as Error).message}\n${usage}`);
    process.exit(2);
  }
  if (values.help) {
    console.log(usage);
    process.exit(0);
  }
  delete values.help;
  return values as Values<O>;
}

/** `values[key]` (a string option benchArgs parsed) as an integer of at least `min`; anything else
 * prints what was wrong and exits 2. */
export function intOption(tool: string, values: Readonly<Record<string, unknown>>, key: string, min = 1): number {
  const v = Number(values[key]);
  if (Number.isSafeInteger(v) && v >= min) return v;
  console.error(`${tool}: --${key} must be an integer of at least ${min}; got ${JSON.stringify(values[key])}`);
  process.exit(2);
}

/** `values[key]` as a number above 0 (sizes in GiB); anything else prints what was wrong and exits 2. */
export function positiveOption(tool: string, values: Readonly<Record<string, unknown>>, key: string): number {
  const v = Number(values[key]);
  if (Number.isFinite(v) && v > 0) return v;
  console.error(`${tool}: --${key} must be a number above 0; got ${JSON.stringify(values[key])}`);
  process.exit(2);
}
