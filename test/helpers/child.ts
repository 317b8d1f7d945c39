// A child Node process that answers JSON lines, for tests that need a second process.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface, type Interface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export class JsonChild {
  readonly process: ChildProcess;
  readonly #lines: AsyncIterator<string>;
  readonly #rl: Interface;

  constructor(fixture: string, args: string[] = [], env: NodeJS.ProcessEnv = process.env) {
    const file = fileURLToPath(new URL(`../fixtures/${fixture}.js`, import.meta.url));
    this.process = spawn(process.execPath, [file, ...args], { stdio: ['pipe', 'pipe', 'inherit'], env });
    this.#rl = createInterface({ input: this.process.stdout! });
    this.#lines = this.#rl[Symbol.asyncIterator]();
  }

  async request<T = any>(msg: unknown): Promise<T> {
    this.process.stdin!.write(JSON.stringify(msg) + '\n');
    const next = await this.#lines.next();
    if (next.done) throw new Error('the child exited before answering');
    return JSON.parse(next.value) as T;
  }

  async close(): Promise<number | null> {
    if (this.process.exitCode !== null) return this.process.exitCode;
    this.process.stdin!.write(JSON.stringify({ op: 'exit' }) + '\n');
    this.process.stdin!.end();
    return new Promise((resolve) => this.process.once('exit', (code) => resolve(code)));
  }
}

export function u32Pattern(seed: number, n: number): Uint32Array {
  const a = new Uint32Array(n);
  for (let i = 0; i < n; i++) a[i] = (seed + i) >>> 0;
  return a;
}
