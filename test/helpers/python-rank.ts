// A Python rank of a sharded sync group (python/tests/sharded_member.py) for the Node tests that
// run one beside Node ranks (test/cpu/sharded-interop, test/gpu/python-sharded): a child that
// prints JSON lines and reads commands.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { PYTHON, PYTHON_PACKAGE_DIR } from './python.js';

const MEMBER = join(PYTHON_PACKAGE_DIR, 'tests', 'sharded_member.py');

/** A Python rank: JSON lines out, commands in. */
export class PythonRank {
  readonly child: ChildProcess;
  readonly #lines: string[] = [];
  readonly #waiters: Array<(line: string | undefined) => void> = [];
  #ended = false;
  #stderr = '';

  /** `spec`: what sharded_member.py takes; `waitMs`: how long next() waits by default; `env`: added to this process's. */
  constructor(spec: unknown, readonly waitMs = 60_000, env: Record<string, string> = {}) {
    this.child = spawn(PYTHON, [MEMBER, JSON.stringify(spec)], { env: { ...process.env, ...env, PYTHONPATH: PYTHON_PACKAGE_DIR }, stdio: ['pipe', 'pipe', 'pipe'] });
    let buffered = '';
    this.child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      buffered += chunk;
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        const w = this.#waiters.shift();
        if (w) w(line); else this.#lines.push(line);
      }
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => { this.#stderr += chunk; });
    this.child.on('exit', () => {
      this.#ended = true;
      for (const w of this.#waiters.splice(0)) w(undefined);
    });
  }

  /** The next JSON line (fails loudly after `ms` or when the process ended). */
  async next(ms = this.waitMs): Promise<any> {
    const line = this.#lines.shift() ?? (this.#ended ? undefined : await new Promise<string | undefined>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the Python rank said nothing within ${ms} ms; its stderr:\n${this.#stderr}`)), ms);
      this.#waiters.push((l) => { clearTimeout(timer); resolve(l); });
    }));
    if (line === undefined) throw new Error(`the Python rank exited; its stderr:\n${this.#stderr}`);
    return JSON.parse(line);
  }

  send(command: string): void {
    this.child.stdin!.write(`${command}\n`);
  }

  async exit(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = once(this.child, 'exit');
      this.child.stdin!.end('exit\n');
      await exited;
    }
  }
}
