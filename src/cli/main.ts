#!/usr/bin/env node
// The `cuda-ipc` command. Exit status: 0 success, 1 the command failed, 2 usage error.
import { parseArgv, UsageError, wantsHelp } from './args.js';
import { closest } from '../arg-errors.js';
import { commands, findCommand } from './commands.js';
import { commandHelp, mainHelp, packageVersion } from './help.js';
import { terminalSafe } from './terminal-text.js';

const EXIT_OK = 0;
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;

function usageError(where: string, message: string, helpCommand: string, what = 'the options and an example'): number {
  console.error(terminalSafe(`${where}: ${message}`));
  console.error(`Run '${helpCommand}' for ${what}.`);
  return EXIT_USAGE;
}

function unknownCommand(name: string): number {
  const guess = closest(name, commands.map((c) => c.name));
  return usageError(
    'cuda-ipc',
    `unknown command '${name}'${guess ? `; did you mean '${guess}'?` : ''} (commands: ${commands.map((c) => c.name).join(', ')})`,
    'cuda-ipc --help',
    'the commands',
  );
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h') {
    console.log(mainHelp(commands));
    return EXIT_OK;
  }
  if (name === '--version' || name === '-v' || name === 'version') {
    console.log(packageVersion());
    return EXIT_OK;
  }
  if (name === 'help') {
    if (rest.length === 0) {
      console.log(mainHelp(commands));
      return EXIT_OK;
    }
    const c = findCommand(rest[0]!);
    if (!c) return unknownCommand(rest[0]!);
    if (rest.length > 1) return usageError('cuda-ipc help', `unexpected argument '${rest[1]}': help takes one COMMAND`, 'cuda-ipc --help', 'the commands');
    console.log(commandHelp(c));
    return EXIT_OK;
  }
  if (name.startsWith('-')) {
    return usageError('cuda-ipc', `unknown option '${name}' before the command; global options are --help and --version`, 'cuda-ipc --help', 'the commands');
  }
  const command = findCommand(name);
  if (!command) return unknownCommand(name);
  if (wantsHelp(rest)) {
    console.log(commandHelp(command));
    return EXIT_OK;
  }
  try {
    return await command.run(parseArgv(command.name, command, rest));
  } catch (e) {
    if (e instanceof UsageError) return usageError(`cuda-ipc ${name}`, e.message, `cuda-ipc ${name} --help`);
    const err = e as Error & { code?: string };
    // Messages may quote a file or a peer: nothing in them may drive the terminal.
    console.error(terminalSafe(`cuda-ipc ${name}: ${err.code ? `[${err.code}] ` : ''}${err.message ?? String(e)}`));
    return EXIT_FAILED;
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
