// Issue 29, links, attacked by a second local user ('nobody', test/fixtures/mallory.ts) with root
// as the victim: the socket name of listen() swapped for a symlink while it is made (Node and
// Python listeners, in a sticky and in a plain world-writable directory), and an allowed peer
// flooding a listener with silent connections (Node and Python). Each held: the victim's file is
// unchanged, every failure is a typed error, the victim's own connection gets through. The table
// of attacks and what each got is printed as a diagnostic.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn as spawnProcess } from 'node:child_process';
import { once } from 'node:events';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setImmediate as yieldLoop, setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../../src/errors.js';
import { connect, listen } from '../../src/link/index.js';
import { Mallory, Secret, attackTable, noSecondUser, nobody, report, sharedDirectory, tally } from '../helpers/attacker.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';

const skip = noSecondUser;
const pySkip = noSecondUser ?? noPython;
const VICTIM_PY = pythonFixture('listen_victim.py');
const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  if (!skip) console.log(`attacks on links (issue 29)\n${attackTable()}`);
});

function shared(mode: 0o1777 | 0o777): string {
  const d = sharedDirectory(mode);
  dirs.push(d);
  return d;
}

/** A Python child of the victim's (root): resolves with its JSON lines as they come. */
function python(args: string[]): { lines: AsyncIterator<string>; exit: Promise<unknown> } {
  const child = spawnProcess(PYTHON, [VICTIM_PY, ...args], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR } });
  return { lines: createInterface({ input: child.stdout! })[Symbol.asyncIterator](), exit: once(child, 'exit') };
}

for (const mode of [0o1777, 0o777] as const) {
  const where = mode === 0o1777 ? 'a sticky shared directory' : 'a world-writable directory';
  test(`listen() in ${where}: the socket name swapped for a symlink to the victim's file while it is made`, { skip }, async () => {
    const dir = shared(mode);
    const secret = new Secret();
    const mallory = await Mallory.start();
    try {
      const outcomes: Record<string, number> = {};
      let racing = true;
      const race = mallory.ask<{ swaps: number; folders: number }>({ op: 'race-socket', dir, name: 'race', target: secret.path, ms: 2000 });
      void race.finally(() => { racing = false; });
      while (racing) {
        let key = 'ok';
        try {
          listen('race', { directory: dir, allowUids: [nobody.uid] }).close();
        } catch (e) {
          key = e instanceof IpcError ? e.code : `untyped: ${String(e)}`;
        }
        outcomes[key] = (outcomes[key] ?? 0) + 1;
        await yieldLoop();
      }
      const r = await race;
      report(`Node listen() in ${where}, name swapped for a symlink (${r.swaps} swaps, ${r.folders} private folders moved)`, tally(outcomes), `secret ${secret.state()}`);
      assert.equal(secret.state(), 'unchanged');
      assert.deepEqual(Object.keys(outcomes).filter((k) => k !== 'ok' && !k.startsWith('ERR_')), [], 'every failure is a typed error');
      assert.ok(r.swaps > 0, 'the attacker did plant symlinks');
    } finally {
      await mallory.end();
    }
  });

  test(`Python listen() in ${where}: the same race`, { skip: pySkip }, async () => {
    const dir = shared(mode);
    const secret = new Secret();
    const mallory = await Mallory.start();
    try {
      const victim = python(['race', dir, 'race', '2', String(nobody.uid)]);
      const r = await mallory.ask<{ swaps: number; folders: number }>({ op: 'race-socket', dir, name: 'race', target: secret.path, ms: 2000 });
      const line = await victim.lines.next();
      await victim.exit;
      const outcomes = JSON.parse(line.value as string) as Record<string, number>;
      report(`Python listen() in ${where}, name swapped for a symlink (${r.swaps} swaps, ${r.folders} private folders moved)`, tally(outcomes), `secret ${secret.state()}`);
      assert.equal(secret.state(), 'unchanged');
      assert.deepEqual(Object.keys(outcomes).filter((k) => k !== 'ok' && !k.startsWith('ERR_')), [], 'every failure is a typed error');
      assert.ok(r.swaps > 0, 'the attacker did plant symlinks');
      assert.ok(Object.values(outcomes).reduce((a, b) => a + b, 0) > 0, 'the victim listened while the attacker raced');
    } finally {
      await mallory.end();
    }
  });
}

/**
 * Waits until the attacker's flood has been answered (every connection past its uid's bound told
 * busy, as the attacker sees it, and `refused()` says the listener's side when it can), for at
 * most 60 s, and returns what the attacker saw.
 */
async function floodAnswered(mallory: Mallory, bound: number, refused?: () => number): Promise<{ held: number; busy: number; refused?: number }> {
  const end = Date.now() + 60_000;
  for (;;) {
    const c = await mallory.ask<{ held: number; busy: number }>({ op: 'count-busy' });
    if (c.busy >= c.held - bound || Date.now() > end) return { ...c, ...(refused ? { refused: refused() } : {}) };
    await sleep(50);
  }
}

test('an allowed peer floods a Node listener with silent connections: the victim still connects, the flood is told busy', { skip }, async () => {
  const dir = shared(0o1777);
  // A long handshake timeout: the flood's connections stay held for the whole test.
  const listener = listen('flood', { directory: dir, allowUids: [nobody.uid], handshakeTimeoutMs: 60_000 });
  const refused: IpcError[] = [];
  listener.on('refused', (e) => refused.push(e));
  const mallory = await Mallory.start();
  try {
    const flood = await mallory.ask<{ held: number; failed: number }>({ op: 'flood', path: listener.path, count: 200 });
    const told = await floodAnswered(mallory, 16, () => refused.length);
    assert.equal(told.busy, told.held - 16, `all but maxPendingPerUid (16) of the flood were refused as busy (${JSON.stringify(told)})`);
    // The victim's own connection gets through at once, the flood notwithstanding.
    const [mine, accepted] = await Promise.all([connect('flood', { directory: dir, timeout: 5000 }), listener.accept({ timeout: 5000 })]);
    assert.equal(accepted.peer.uid, process.getuid!());
    // The attacker's next connection is told why (not ERR_PEER_GONE).
    const theirs = await mallory.ask<{ connected: boolean; code?: string }>({ op: 'connect', dir, name: 'flood', timeout: 500, allowUid: process.getuid!() });
    assert.deepEqual(theirs, { connected: false, code: 'ERR_LISTENER_BUSY' });
    assert.ok(refused.length > 0 && refused.every((e) => e.code === 'ERR_LIMIT_REACHED' && e.limit === 'maxPendingPerUid'), 'the listener reports each refusal');
    report(`${flood.held} silent connections of an allowed uid to a Node listener`, `${told.busy} refused busy (REFUSE 4); victim's connect served; attacker's connect: ${theirs.code}`, 'victim connected');
    mine.close();
    accepted.close();
  } finally {
    await mallory.end();
    listener.close();
  }
});

test('an allowed peer floods a Python listener with silent connections: it handshakes side by side and tells the flood it is busy', { skip: pySkip }, async () => {
  const dir = shared(0o1777);
  const victim = python(['serve', dir, 'pyflood', String(nobody.uid)]);
  const listening = JSON.parse((await victim.lines.next()).value as string) as { listening: string };
  const mallory = await Mallory.start();
  try {
    const flood = await mallory.ask<{ held: number; failed: number }>({ op: 'flood', path: listening.listening, count: 40 });
    const told = await floodAnswered(mallory, 16);
    assert.equal(told.busy, told.held - 16, 'all but max_pending_per_uid (16) of the flood were refused as busy');
    const link = await connect('pyflood', { directory: dir, timeout: 10_000 });
    assert.equal(await link.receive({ timeout: 10_000 }), 'welcome');
    const served = JSON.parse((await victim.lines.next()).value as string) as { accepted: number; pending: number };
    assert.equal(served.accepted, process.getuid!());
    link.close();
    await victim.exit;
    report(`${flood.held} silent connections of an allowed uid to a Python listener`, `${told.busy} refused busy; victim's connect served while ${served.pending} silent ones waited their handshake`, 'victim connected');
  } finally {
    await mallory.end();
  }
});
