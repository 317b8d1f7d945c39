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
