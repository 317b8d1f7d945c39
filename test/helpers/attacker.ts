// A second local user for the security tests (issue 29): the attacker runs as 'nobody' (CI runs as
// root, which may start a child as another user; elsewhere the tests skip and say why), the victim
// is this process (root) or its children. The victim's own file that attacks aim at, and the table
// of attacks and what each got, printed as test diagnostics.
import { chmodSync, lstatSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn, type Link } from '../../src/link/index.js';
import { cannotRunAsNobody, lookupUser, type User } from '../fixtures/users.js';

export const MALLORY = new URL('../fixtures/mallory.js', import.meta.url);
/** Why these tests cannot run here, or undefined. */
export const noSecondUser: string | undefined = cannotRunAsNobody(MALLORY);
export const nobody: User = lookupUser('nobody') ?? { uid: 65534, gid: 65534 };

/** The attacker process: ask() sends a command (see test/fixtures/mallory.ts) and awaits its report. */
export class Mallory {
  readonly #link: Link;
  private constructor(link: Link) {
    this.#link = link;
  }
  static async start(): Promise<Mallory> {
    const { link } = await spawn(MALLORY, [], { uid: nobody.uid, gid: nobody.gid, allowUids: [nobody.uid], stdio: ['ignore', 'inherit', 'inherit'] });
    return new Mallory(link);
  }
  async ask<T = Record<string, unknown>>(command: Record<string, unknown>): Promise<T> {
    this.#link.send(command);
    return (await this.#link.receive()) as T;
  }
  async end(): Promise<void> {
    this.#link.send({ op: 'end' });
    await this.#link.end().catch(() => {});
  }
}

/** A directory other users may write to: 0o1777 like /tmp (sticky), or 0o777 (anyone may remove or rename anything). */
export function sharedDirectory(mode: 0o1777 | 0o777): string {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-shared-'));
  chmodSync(dir, mode);
  return dir;
}

/** A file only the victim may read and write, in a folder of its own: what the attacks aim at. */
export class Secret {
  readonly path: string;
  static readonly TEXT = 'the victim\'s own data\n';
  constructor() {
    const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-victim-'));
    this.path = join(dir, 'secret');
    writeFileSync(this.path, Secret.TEXT, { mode: 0o600 });
    chmodSync(dir, 0o755);
  }
  /** What changed about it, or 'unchanged'. */
  state(): string {
    const st = lstatSync(this.path);
    const text = readFileSync(this.path, 'utf8');
    const changes = [
      ...(st.isFile() ? [] : ['no longer a file']),
      ...((st.mode & 0o777) === 0o600 ? [] : [`mode 0${(st.mode & 0o777).toString(8)}`]),
      ...(st.uid === process.getuid!() ? [] : [`owner ${st.uid}`]),
      ...(text === Secret.TEXT ? [] : ['content overwritten']),
    ];
    return changes.length ? changes.join(', ') : 'unchanged';
  }
}

/** Rows of the table of attacks: | attack | what it got now | the victim's files |. */
export const attacks: string[] = [];

export function report(attack: string, got: string, victim: string): void {
  attacks.push(`| ${attack} | ${got} | ${victim} |`);
}

/** The table, for a diagnostic at the end of a file's tests. */
export function attackTable(): string {
  return ['| attack | got now | victim\'s files |', '| --- | --- | --- |', ...attacks].join('\n');
}

/** `{ code: count }` as `ERR_X x3, ok x5`. */
export function tally(counts: Record<string, number>): string {
  return Object.entries(counts).sort().map(([k, n]) => `${k} x${n}`).join(', ');
}
