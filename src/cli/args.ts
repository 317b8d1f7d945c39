// Command-line parsing for `cuda-ipc`: options are declared once (for the parser and the help),
// and every mistake becomes a UsageError whose message names the argument and says what to do.
// Hand-written rather than util.parseArgs, whose messages speak of "ambiguous" arguments where a
// user typed `--elements -5`.
import { closest } from '../arg-errors.js';

/** A mistake in the command line: main prints it with a pointer to --help and exits 2. */
export class UsageError extends Error {
  override name = 'UsageError';
}

export interface OptionSpec {
  readonly type: 'string' | 'boolean';
  /** What the value is, for the help: `N`, `FILE`, `SECONDS`. */
  readonly value?: string;
  readonly help: string;
  /** The command cannot run without it. */
  readonly required?: boolean;
}

export interface PositionalSpec {
  /** As the help shows it: `FILE`, `MODE`. */
  readonly name: string;
  readonly required: boolean;
  readonly help: string;
  /** The only values allowed, if it is a choice. */
  readonly choices?: readonly string[];
}

export interface ArgsSpec {
  readonly options: Readonly<Record<string, OptionSpec>>;
  readonly positionals: readonly PositionalSpec[];
}

export interface ParsedArgs {
  readonly values: Readonly<Record<string, string | true | undefined>>;
  readonly positionals: readonly string[];
}

/** True when the user asked for help anywhere before a `--`. */
export function wantsHelp(argv: readonly string[]): boolean {
  for (const a of argv) {
    if (a === '--') return false;
    if (a === '--help' || a === '-h') return true;
  }
  return false;
}

const optionList = (spec: ArgsSpec): string =>
  Object.entries(spec.options).map(([n, o]) => (o.type === 'string' ? `--${n} ${o.value ?? 'VALUE'}` : `--${n}`)).join(', ') || 'no options';

/** Parses `argv` for `command` (e.g. 'roundtrip'), or throws a UsageError that says what is wrong. */
export function parseArgv(command: string, spec: ArgsSpec, argv: readonly string[]): ParsedArgs {
  const values: Record<string, string | true | undefined> = {};
  const positionals: string[] = [];
  const names = Object.keys(spec.options);
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!arg.startsWith('-') || arg === '-') {
      positionals.push(arg);
      continue;
    }
    if (!arg.startsWith('--')) {
      throw new UsageError(`unknown option '${arg}': ${command} takes ${optionList(spec)} (only -h has a short form)`);
    }
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const opt = spec.options[name];
    if (!opt) {
      const guess = closest(name, names);
      throw new UsageError(`unknown option '--${name}'${guess ? `; did you mean --${guess}?` : ''} (${command} takes ${optionList(spec)})`);
    }
    if (values[name] !== undefined) throw new UsageError(`--${name} is given twice; give it once`);
    if (opt.type === 'boolean') {
      if (eq >= 0) throw new UsageError(`--${name} takes no value (got '${arg}'); write just --${name}`);
      values[name] = true;
      continue;
    }
    let value: string | undefined;
    if (eq >= 0) value = arg.slice(eq + 1);
    else {
      value = argv[i + 1];
      // A value may start with '-' (it is checked later, e.g. "-5 is not a positive integer");
      // another option in its place means the value was forgotten.
      if (value === undefined || value.startsWith('--')) value = undefined;
      else i++;
    }
    if (value === undefined || value === '') {
      throw new UsageError(`--${name} needs a value: --${name} ${opt.value ?? 'VALUE'}, ${opt.help}`);
    }
    values[name] = value;
  }
  for (const [name, o] of Object.entries(spec.options)) {
    if (o.required && values[name] === undefined) throw new UsageError(`missing --${name} ${o.value ?? 'VALUE'}: ${o.help}`);
  }
  const max = spec.positionals.length;
  if (positionals.length > max) {
    const extra = positionals[max]!;
    throw new UsageError(
      max === 0
        ? `unexpected argument '${extra}': ${command} takes no arguments, only options (${optionList(spec)})`
        : `unexpected argument '${extra}': ${command} takes ${spec.positionals.map((p) => p.name).join(' ')} and options only`,
    );
  }
  spec.positionals.forEach((p, i) => {
    const v = positionals[i];
    if (v === undefined) {
      if (p.required) throw new UsageError(`missing ${p.name}: ${p.help}`);
      return;
    }
    if (p.choices && !p.choices.includes(v)) {
      const guess = closest(v, p.choices);
      throw new UsageError(`${p.name} must be one of ${p.choices.map((c) => `'${c}'`).join(', ')}; got '${v}'${guess ? ` (did you mean '${guess}'?)` : ''}`);
    }
  });
  return { values, positionals };
}

// ---------------------------------------------------------------------------------------------
// Values

export function stringValue(args: ParsedArgs, name: string): string | undefined {
  const v = args.values[name];
  return typeof v === 'string' ? v : undefined;
}

/** A positive integer option (e.g. --elements), or `fallback` when absent. */
export function countOption(args: ParsedArgs, name: string, fallback: number): number {
  const value = stringValue(args, name);
  if (value === undefined) return fallback;
  const n = /^\s*\d+\s*$/.test(value) ? Number(value) : NaN;
  if (!Number.isSafeInteger(n) || n <= 0) throw new UsageError(`--${name} must be a positive integer, got '${value}'`);
  return n;
}

/** The longest delay a Node.js timer holds (2^31-1 ms, about 24.8 days); longer ones fire at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;
/** MAX_TIMER_MS in whole seconds: the most any duration option takes. */
export const MAX_SECONDS = Math.floor(MAX_TIMER_MS / 1000);

/** A positive number of seconds, at most MAX_SECONDS (what a timer can hold), returned in whole milliseconds (at least 1). */
export function secondsOption(args: ParsedArgs, name: string, fallbackSeconds: number): number {
  const value = stringValue(args, name);
  if (value === undefined) return fallbackSeconds * 1000;
  const s = value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(s) || s <= 0) throw new UsageError(`--${name} must be a positive number of seconds, got '${value}'`);
  if (s > MAX_SECONDS) {
    throw new UsageError(`--${name} ${value} is longer than a timer can wait: at most ${MAX_SECONDS} seconds (2^31-1 ms, about 24.8 days)`);
  }
  return Math.max(1, Math.round(s * 1000));
}

/** A positive whole number of milliseconds (e.g. demo's --ms), at most MAX_TIMER_MS, or `fallback`. */
export function millisecondsOption(args: ParsedArgs, name: string, fallback: number): number {
  const ms = countOption(args, name, fallback);
  if (ms > MAX_TIMER_MS) throw new UsageError(`--${name} ${ms} is longer than a timer can wait: at most ${MAX_TIMER_MS} ms (2^31-1, about 24.8 days)`);
  return ms;
}

/** A device ordinal (default 0). */
export function ordinalOption(args: ParsedArgs, name: string): number {
  const value = stringValue(args, name);
  if (value === undefined) return 0;
  const n = /^\s*\d+\s*$/.test(value) ? Number(value) : NaN;
  if (!Number.isSafeInteger(n) || n < 0) throw new UsageError(`--${name} must be a device ordinal (0, 1, ...), got '${value}'`);
  return n;
}
