#!/usr/bin/env node
// The `cuda-ipc` command.
import { parseArgs } from 'node:util';
import { collectInfo, formatInfo } from './info.js';

const USAGE = `usage: cuda-ipc <command> [options]

commands:
  info [--json]                         devices, capabilities and driver
  produce --out FILE [options]          allocate, fill a pattern, write a descriptor, wait
  consume FILE [options]                open a descriptor, verify, double in place, signal
  roundtrip [--elements N] [--device D] hand a buffer to a child process and back
  demo events [--ms T]                  a child waits on the parent's kernel through an IPC event
  demo transform [--elements N]         a child doubles shared values with a kernel
  demo tensors [--count N]              a producer drops buffers it sent; the consumer still reads them
  help                                  this text`;

type Command = (argv: string[]) => Promise<number> | number;

const commands: Record<string, Command> = {
  info(argv) {
    const { values } = parseArgs({ args: argv, options: { json: { type: 'boolean', default: false } } });
    const report = collectInfo();
    console.log(values.json ? JSON.stringify(report, null, 2) : formatInfo(report));
    return 0;
  },
  async produce(argv) {
    return (await import('./produce.js')).produce(argv);
  },
  async consume(argv) {
    return (await import('./consume.js')).consume(argv);
  },
  async roundtrip(argv) {
    return (await import('./roundtrip.js')).roundtrip(argv);
  },
  async demo(argv) {
    return (await import('./demo.js')).demo(argv);
  },
  help() {
    console.log(USAGE);
    return 0;
  },
};

async function main(): Promise<number> {
  const [name, ...rest] = process.argv.slice(2);
  const command = commands[name ?? 'help'];
  if (!command) {
    console.error(`cuda-ipc: unknown command '${name}'\n\n${USAGE}`);
    return 2;
  }
  try {
    return await command(rest);
  } catch (e) {
    const err = e as Error & { code?: string };
    console.error(`cuda-ipc ${name}: ${err.code ? `[${err.code}] ` : ''}${err.message}`);
    return 1;
  }
}

main().then((code) => { process.exitCode = code; });
