// CLI manners: help for everything, a version, and every bad argument a usage error (exit 2)
// whose message names the argument. None of these touch a GPU.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { commands } from '../../src/cli/commands.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const pkg = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string };

const run = (...args: string[]) => spawnSync(process.execPath, [cli, ...args], { encoding: 'utf8' });

test('cuda-ipc --help, -h, help and no arguments print the command list and the exit codes', () => {
  for (const args of [['--help'], ['-h'], ['help'], []]) {
    const r = run(...args);
    assert.equal(r.status, 0, `${args.join(' ')}: ${r.stderr}`);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /^cuda-ipc \d+\.\d+\.\d+: /);
    for (const c of commands) assert.match(r.stdout, new RegExp(`^  ${c.name} +\\S`, 'm'), `lists ${c.name}`);
    assert.match(r.stdout, /exit status:\n  0  success.*\n  1  the command failed.*\n  2  usage error/);
    assert.match(r.stdout, /CUDA_IPC_STATUS=0/);
  }
});

test('--version prints the version from package.json', () => {
  const r = run('--version');
  assert.equal(r.status, 0);
  assert.equal(r.stdout.trim(), pkg.version);
});

test('every command answers --help, -h and help COMMAND with its options and an example', () => {
  for (const c of commands) {
    for (const args of [[c.name, '--help'], [c.name, '-h'], ['help', c.name], [c.name, '--elements', '-5', '--help']]) {
      const r = run(...args);
      assert.equal(r.status, 0, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stdout, new RegExp(`^usage: cuda-ipc ${c.name}`), args.join(' '));
      for (const name of Object.keys(c.options)) assert.match(r.stdout, new RegExp(`^  --${name}\\b`, 'm'), `${c.name} --help lists --${name}`);
      assert.match(r.stdout, /^examples?:\n  cuda-ipc /m);
      assert.match(r.stdout, /exit status:\n  0 .*\n  1 .*\n  2  usage error/);
    }
  }
});

test('bad arguments exit 2 with a message that names the argument and points to --help', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-cli-'));
  try {
    const cases: Array<[string[], RegExp]> = [
      [['frobnicate'], /unknown command 'frobnicate'/],
      [['statsu'], /unknown command 'statsu'; did you mean 'status'\?/],
      [['help', 'frobnicate'], /unknown command 'frobnicate'/],
      [['--verbose'], /unknown option '--verbose'/],
      [['roundtrip', '--elements', '-5'], /--elements must be a positive integer, got '-5'/],
      [['roundtrip', '--elements', 'many'], /--elements must be a positive integer, got 'many'/],
      [['roundtrip', '--elements', '1.5'], /--elements must be a positive integer, got '1\.5'/],
      [['roundtrip', '--elements'], /--elements needs a value: --elements N/],
      [['roundtrip', '--elements', '--device', '0'], /--elements needs a value/],
      [['roundtrip', '--elemnts', '4'], /unknown option '--elemnts'; did you mean --elements\?/],
      [['roundtrip', '-e', '4'], /unknown option '-e'/],
      [['roundtrip', 'now'], /unexpected argument 'now'/],
      [['roundtrip', '--device', 'first'], /--device must be a device ordinal \(0, 1, \.\.\.\), got 'first'/],
      [['roundtrip', '--elements', '4', '--elements', '8'], /--elements is given twice/],
      [['info', '--json=yes'], /--json takes no value/],
      [['consume'], /missing FILE/],
      [['consume', dir], new RegExp(`FILE ${dir} is a directory; give a file in it, e\\.g\\. cuda-ipc consume ${dir}/handle\\.json`)],
      [['consume', join(dir, 'no', 'such', 'handle.json')], /the directory .*no\/such does not exist/],
      [['consume', 'handle.json', '--timeout', '-1'], /--timeout must be a positive number of seconds, got '-1'/],
      [['consume', 'a.json', 'b.json'], /unexpected argument 'b\.json'/],
      [['produce'], /missing --out FILE/],
      [['produce', '--out', dir], /--out .* is a directory/],
      [['produce', '--out', 'h.json', '--elements', '0'], /--elements must be a positive integer, got '0'/],
      [['demo'], /missing MODE/],
      [['demo', 'fireworks'], /MODE must be one of 'events', 'transform', 'tensors'; got 'fireworks'/],
      [['demo', 'events', '--count', '3'], /--count is for 'demo tensors', not 'demo events'/],
      [['demo', 'events', '--ms', 'long'], /--ms must be a positive integer, got 'long'/],
      [['status', '--dir', join(dir, 'none')], /--dir .*none is not a directory/],
      [['status', '--watch'], /unknown option '--watch'/],
      [['top', '--interval', '0'], /--interval must be a positive number of seconds, got '0'/],
      [['top', '--iterations', 'x'], /--iterations must be a positive integer, got 'x'/],
    ];
    for (const [args, message] of cases) {
      const r = run(...args);
      assert.equal(r.status, 2, `cuda-ipc ${args.join(' ')} exits 2: ${r.stdout}${r.stderr}`);
      assert.match(r.stderr, message, `cuda-ipc ${args.join(' ')}`);
      assert.match(r.stderr, /Run 'cuda-ipc (\w+ )?--help' for/, `cuda-ipc ${args.join(' ')} points to the help`);
      assert.equal(r.stdout, '', `cuda-ipc ${args.join(' ')} prints nothing else`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('roundtrip past the memory there is: a usage error on host memory, the out-of-memory error naming the size on a GPU', () => {
  const elements = 2 ** 48;  // 2^50 bytes
  const r = run('roundtrip', '--elements', String(elements));
  if (r.stdout.includes('CUDA IPC is not available here')) {
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`--elements ${elements} needs ${elements * 4} bytes of host memory, more than this machine has`));
  } else {
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, new RegExp(`CUDA_ERROR_OUT_OF_MEMORY.*asked for ${elements * 4} bytes`));
  }
});
