// Ranks of a sharded sync group in child processes (test/fixtures/shard-member.ts) for the CPU and
// GPU group tests: started over spawn(), asked to join, sync, check and close over that link; every
// answer awaited with a deadline that fails loudly; children still alive at the end are killed.
import { after } from 'node:test';
import { spawn, type Link, type SpawnedChild } from '../../src/link/index.js';
import type { Scenario } from './shard-group.js';
import { within } from './wait.js';

export interface Reply { ok: boolean; code?: string; message?: string; detail?: any; version?: number; epoch?: number; problems?: string[]; state?: string; fds?: number; paths?: any }

const children = new Set<SpawnedChild['child']>();
after(() => { for (const c of children) if (c.exitCode === null) c.kill('SIGKILL'); });

/** One child rank. */
export class Member {
  #next = 0;
  readonly #pending = new Map<number, (r: Reply) => void>();
  constructor(readonly rank: number, readonly child: SpawnedChild['child'], readonly link: Link, readonly answerMs: number) {
    link.on('message', (m: any) => { const r = this.#pending.get(m.id); this.#pending.delete(m.id); r?.(m); });
  }
  ask(op: string, args: Record<string, unknown> = {}): Promise<Reply> {
    const id = this.#next++;
    const p = new Promise<Reply>((resolve) => this.#pending.set(id, resolve));
    this.link.send({ id, op, ...args });
    return within(p, `rank ${this.rank}'s answer to '${op}'`, this.answerMs);
  }
  kill(): Promise<void> {
    const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.kill('SIGKILL');
    return within(gone, `rank ${this.rank} to exit`);
  }
}

/** Options of startMember: the scenario, the hub's token, the memory, the child's extra environment. */
export interface MemberOptions {
  scenario: Scenario;
  token?: string;
  memory?: 'host' | 'device';
  env?: Record<string, string>;
  /** How long an answer may take (default 60 s). */
  answerMs?: number;
}

/** Starts rank `rank` and asks it to join the group at `connectTo`; `joined` is its answer. */
export async function startMember(rank: number, connectTo: string, o: MemberOptions): Promise<{ m: Member; joined: Promise<Reply> }> {
  const { child, link } = await spawn(new URL('../fixtures/shard-member.js', import.meta.url), [], { stdio: 'inherit', ...(o.env && { env: { ...process.env, ...o.env } }) });
  children.add(child);
  const m = new Member(rank, child, link, o.answerMs ?? 60_000);
  return { m, joined: m.ask('join', { rank, connect: connectTo, scenario: o.scenario, ...(o.token && { token: o.token }), ...(o.memory && { memory: o.memory }) }) };
}
