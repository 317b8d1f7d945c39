// The help texts: `cuda-ipc --help` and `cuda-ipc COMMAND --help`, made from the command specs.
import { readFileSync } from 'node:fs';
import type { CommandSpec } from './commands.js';

const WIDTH = 96;

/** The package's version, from its package.json (two levels above dist/src/cli). */
export function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version?: string };
  return pkg.version ?? 'unknown';
}

/** Wraps `text` at WIDTH, every line starting with `indent`. */
function wrap(text: string, indent: string): string[] {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line && indent.length + line.length + 1 + word.length > WIDTH) {
      lines.push(indent + line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) lines.push(indent + line);
  return lines;
}

/** Two columns: names padded to one width, help wrapped beside them. */
function table(rows: ReadonlyArray<readonly [string, string]>, indent = '  '): string[] {
  const w = Math.max(...rows.map(([k]) => k.length));
  const out: string[] = [];
  for (const [k, v] of rows) {
    const wrapped = wrap(v, ' '.repeat(indent.length + w + 2));
    out.push(indent + k.padEnd(w) + '  ' + (wrapped[0] ?? '').trimStart());
    out.push(...wrapped.slice(1));
  }
  return out;
}

export const EXIT_STATUS: ReadonlyArray<readonly [string, string]> = [
  ['0', 'success; also where there is no GPU (the command says why)'],
  ['1', 'the command failed; its message says what went wrong'],
  ['2', 'usage error: an unknown command or option, a missing or bad value; the message names it'],
];

export function synopsis(c: CommandSpec): string {
  const parts = [`cuda-ipc ${c.name}`];
  for (const p of c.positionals) parts.push(p.required ? p.name : `[${p.name}]`);
  for (const [name, o] of Object.entries(c.options)) {
    const text = o.type === 'string' ? `--${name} ${o.value ?? 'VALUE'}` : `--${name}`;
    parts.push(o.required ? text : `[${text}]`);
  }
  return parts.join(' ');
}

export function commandHelp(c: CommandSpec): string {
  const lines = [`usage: ${synopsis(c)}`, '', ...wrap(c.description, ''), ''];
  const rows: Array<[string, string]> = c.positionals.map((p) => [p.name, p.choices ? `one of: ${p.choices.join(', ')}` : p.help]);
  for (const [name, o] of Object.entries(c.options)) {
    rows.push([o.type === 'string' ? `--${name} ${o.value ?? 'VALUE'}` : `--${name}`, o.required ? `${o.help} (required)` : o.help]);
  }
  rows.push(['-h, --help', 'show this help']);
  lines.push(c.positionals.length ? 'arguments and options:' : 'options:', ...table(rows), '');
  lines.push(c.examples.length > 1 ? 'examples:' : 'example:', ...c.examples.map((e) => `  ${e}`), '');
  lines.push('exit status:', ...table(EXIT_STATUS));
  if (c.exitNotes) lines.push(...wrap(c.exitNotes, '  '));
  return lines.join('\n');
}

export function mainHelp(commands: readonly CommandSpec[]): string {
  return [
    `cuda-ipc ${packageVersion()}: share CUDA GPU memory and events between processes with zero copies`,
    '',
    'usage: cuda-ipc COMMAND [options]',
    '       cuda-ipc COMMAND --help      options and an example for COMMAND (or: cuda-ipc help COMMAND)',
    '',
    'commands:',
    ...table(commands.map((c) => [c.name, c.summary] as const)),
    '',
    'options:',
    ...table([['-h, --help', 'show this help'], ['--version', 'print the version']]),
    '',
    'exit status:',
    ...table(EXIT_STATUS),
    '',
    'environment:',
    ...table([
      ['CUDA_IPC_DEVICE', 'the default of --device: an ordinal or a device UUID (GPU-...), checked as --device is'],
      ['CUDA_IPC_STATUS=0', 'processes publish no status records (cuda-ipc status and top then do not list them)'],
      ['CUDA_IPC_TOKEN', 'the shared token of links between machines (produce --listen, consume tcp://...; cuda-ipc token prints a fresh one)'],
      ['XDG_RUNTIME_DIR', 'where the private socket directory cuda-ipc-<uid> lives (else the temp directory); the status records are in its status/ folder'],
    ]),
    '',
    'example:',
    '  cuda-ipc roundtrip            # a buffer to a child process and back (host memory without a GPU)',
  ].join('\n');
}
