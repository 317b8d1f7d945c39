// TCP listeners under a flood of connections that never authenticate (issue 40 point 1), and the
// bounds that keep them fair: one address reopening silent connections as fast as they are closed
// does not keep an honest client from another address out; the listener's memory and its
// 'refused' events stay bounded however many it refuses; maxPending counts links waiting for
// accept(); a connect() closed before authentication tries again and then says ERR_LISTENER_BUSY.
// Loopback only: the flood comes from 127.0.0.2, the honest client from 127.0.0.1.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { IpcError } from '../../src/errors.js';
import { connect, listen, type Link, type RefusedReport } from '../../src/link/index.js';
import { sourceOf } from '../../src/link/connect/tcp-listener.js';
import { TOKEN } from '../fixtures/tcp-peer.js';

const FIXTURE = new URL('../fixtures/tcp-flood-listener.js', import.meta.url);
const code = (c: string) => (e: unknown): boolean => {
  assert.ok(e instanceof IpcError, `an IpcError, got ${String(e)}`);
  assert.equal(e.code, c, e.message);
  return true;
};

/** The resident set of process `pid`, in KiB (/proc/PID/status VmRSS). */
function rssKiB(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  assert.ok(m, 'VmRSS in /proc/PID/status');
  return Number(m[1]);
}

/** Silent connections from `localAddress`, each opened again as soon as it closes, `width` at once, until stop(). */
function flood(port: number, localAddress: string, width: number): { closes: () => number; opens: () => number; stop: () => Promise<void> } {
  let closes = 0;
  let opens = 0;
  let stopped = false;
  const live = new Set<net.Socket>();
  let drained: (() => void) | undefined;
  const open = (): void => {
    if (stopped) return;
    opens++;
    const s = net.connect({ port, host: '127.0.0.1', localAddress });
    live.add(s);
    s.on('error', () => {});
    s.on('close', () => {
      live.delete(s);
      closes++;
      if (stopped) {
        if (live.size === 0) drained?.();
      } else setImmediate(open);
    });
  };
  for (let i = 0; i < width; i++) open();
  return {
    closes: () => closes,
    opens: () => opens,
    stop: () => {
      stopped = true;
      return new Promise<void>((resolve) => {
        if (live.size === 0) resolve();
        drained = resolve;
        for (const s of live) s.destroy();
      });
    },
  };
}

/** Resolves once `f()` is true, polling each 10 ms; fails loudly after `ms`. */
async function until(f: () => boolean, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test('a flood of silent connections from one address, reopened as soon as they close: an honest client from another address gets a working link; the listener\'s RSS and its refused events stay bounded', { timeout: 120_000 }, async (t) => {
  // refusedIntervalMs 60 s: the listener emits at most 2 events (the first refusal at once, the rest
  // gathered into the one its close() flushes), however many it refuses.
  const child = spawn(process.execPath, [FIXTURE.pathname, JSON.stringify({ refusedIntervalMs: 60_000 })], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout! });
  const next = (prefix: string): Promise<string> =>
    new Promise((resolve, reject) => {
      const onLine = (l: string): void => {
        if (!l.startsWith(`${prefix} `)) return;
        lines.off('line', onLine);
        resolve(l.slice(prefix.length + 1));
      };
      lines.on('line', onLine);
      child.once('exit', (c) => reject(new Error(`the listener exited (${c}) before '${prefix}'`)));
    });
  try {
    const url = (await next('url')) as `tcp://${string}`;
    const port = Number(url.split(':')[2]);
    const rss0 = rssKiB(child.pid!);
    const f = flood(port, '127.0.0.2', 200);
    // The flood is on: well past the 8 places its address gets.
    await until(() => f.closes() >= 2000, '2000 flood connections closed by the listener');
    const before = f.closes();
    const link: Link = await connect(url, { token: TOKEN, timeout: 20_000 });
    link.send({ honest: 'yes' });
    assert.deepEqual(await link.receive({ timeout: 20_000 }), { honest: 'yes' }, 'the link works: the listener echoed');
    link.close();
    // The flood was on before the honest client came and is still on after it (2000 more closed); then read the listener's memory and count.
    await until(() => f.closes() >= before + 2000, 'the flood to go on');
    const rss1 = rssKiB(child.pid!);
    const opened = f.opens();
    await f.stop();
    const statsLine = next('stats');
    child.stdin!.end();
    const stats = JSON.parse(await statsLine) as { events: number; reported: number; refusedCount: number; byCode: Record<string, number>; served: number };
    t.diagnostic(`flood: ${opened} connections opened from 127.0.0.2; listener refused ${stats.refusedCount} (${JSON.stringify(stats.byCode)}) in ${stats.events} 'refused' events; RSS ${rss0} -> ${rss1} KiB`);
    assert.equal(stats.served, 1, 'the honest client was served');
    assert.ok(stats.refusedCount >= 2000, `the listener refused the flood (${stats.refusedCount})`);
    assert.equal(stats.reported, stats.refusedCount, 'every refusal is counted in a report');
    assert.ok(stats.events >= 1 && stats.events <= 2, `at most 2 'refused' events with refusedIntervalMs 60 s (${stats.events})`);
    assert.ok((stats.byCode['ERR_LIMIT_REACHED'] ?? 0) > 0, 'most were past maxPendingPerAddress');
    // The documented bound (docs/SECURITY.md): a flood adds less than 64 MiB to the listener's RSS
    // (it levels off: the sockets Node makes for refused connections are garbage, collected).
    assert.ok(rss1 - rss0 < 64 * 1024, `RSS grew by ${rss1 - rss0} KiB`);
  } finally {
    child.kill();
  }
});

test('maxPending counts links waiting for accept(): with maxPending 2 and nobody accepting, clients 3 to 5 do not get in (ERR_LISTENER_BUSY after their retries); both queued links work once accepted', { timeout: 60_000 }, async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxPending: 2, refusedIntervalMs: 0 });
  const reports: Array<[IpcError, RefusedReport]> = [];
  listener.on('refused', (e, r) => reports.push([e, r]));
  const links: Link[] = [];
  try {
    links.push(await connect(listener.url, { token: TOKEN, timeout: 5000 }));
    links.push(await connect(listener.url, { token: TOKEN, timeout: 5000 }));
    for (let i = 3; i <= 5; i++) {
      await assert.rejects(connect(listener.url, { token: TOKEN, timeout: 300 }), (e: unknown) => {
        code('ERR_LISTENER_BUSY')(e);
        assert.match((e as Error).message, /closed \d+ connections? before this side could prove the token and stayed so for 300 ms/);
        return true;
      }, `client ${i}`);
    }
    assert.ok(reports.length >= 3, `each refusal reported (${reports.length})`);
    for (const [e, r] of reports) {
      assert.equal(e.code, 'ERR_LIMIT_REACHED');
      assert.equal(e.limit, 'maxPending');
      assert.deepEqual(r.byCode, { ERR_LIMIT_REACHED: r.count });
      assert.deepEqual(Object.keys(r.bySource), ['127.0.0.1']);
    }
    // Both queued links were made before anyone accepted, and work.
    for (const [i, c] of links.entries()) {
      const a = await listener.accept({ timeout: 5000 });
      c.send(i);
      assert.equal(await a.receive({ timeout: 5000 }), i);
      a.close();
    }
    // Room again.
    const sixth = await connect(listener.url, { token: TOKEN, timeout: 5000 });
    links.push(sixth);
    (await listener.accept({ timeout: 5000 })).close();
  } finally {
    for (const l of links) l.close();
    listener.close();
  }
});

test('a listener that closes every connection before its challenge: connect tries again until its timeout and says ERR_LISTENER_BUSY (timeout 0: at once), never ERR_AUTH_FAILED', async () => {
  // A server that closes every connection at once, counting them.
  const closer = async () => {
    const counted = { seen: 0 };
    const server = net.createServer((s) => {
      counted.seen++;
      s.destroy();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return { counted, server, url: `tcp://127.0.0.1:${(server.address() as net.AddressInfo).port}` as const };
  };
  const retrying = await closer();
  const once = await closer();
  try {
    await assert.rejects(connect(retrying.url, { token: TOKEN, timeout: 400 }), code('ERR_LISTENER_BUSY'));
    assert.ok(retrying.counted.seen >= 2, `it tried again (${retrying.counted.seen} connections)`);
    // A server of its own: a try of the connect above still in flight when it gave up may reach
    // the first one later, so counting there would not say how many this one made.
    await assert.rejects(connect(once.url, { token: TOKEN, timeout: 0 }), code('ERR_LISTENER_BUSY'));
    assert.equal(once.counted.seen, 1, 'timeout 0: one try');
  } finally {
    retrying.server.close();
    once.server.close();
  }
});

test('maxPendingPerAddress counts one address\'s unauthenticated connections; IPv6 addresses count by their /64', async () => {
  assert.equal(sourceOf('10.1.2.3'), '10.1.2.3');
  assert.equal(sourceOf('::ffff:10.1.2.3'), '10.1.2.3');
  assert.equal(sourceOf('2001:db8:1:2:aaaa::1'), '2001:db8:1:2::/64');
  assert.equal(sourceOf('2001:db8:1:2:bbbb:cccc:dddd:eeee'), '2001:db8:1:2::/64');
  assert.equal(sourceOf('::1'), '0:0:0:0::/64');
  assert.equal(sourceOf('fe80::1%eth0'), 'fe80:0:0:0::/64');
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxPendingPerAddress: 2, refusedIntervalMs: 0 });
  const refused: IpcError[] = [];
  listener.on('refused', (e) => refused.push(e));
  const held: net.Socket[] = [];
  try {
    // Two silent ones from 127.0.0.2 hold its places (each got the listener's challenge: admitted).
    for (let i = 0; i < 2; i++) {
      const s = net.connect({ port: listener.port, host: '127.0.0.1', localAddress: '127.0.0.2' });
      s.on('error', () => {});
      held.push(s);
      await new Promise<void>((r) => s.once('data', () => r()));
    }
    // A third from there is closed at once, with nothing sent.
    const third = net.connect({ port: listener.port, host: '127.0.0.1', localAddress: '127.0.0.2' });
    let got = 0;
    third.on('data', (d) => (got += d.byteLength));
    third.on('error', () => {});
    await new Promise<void>((r) => third.once('close', () => r()));
    assert.equal(got, 0, 'not even a challenge');
    await until(() => refused.length > 0, 'the refusal report');
    assert.equal(refused[0]!.code, 'ERR_LIMIT_REACHED');
    assert.equal(refused[0]!.limit, 'maxPendingPerAddress');
    // Another address is not held up by it.
    const [a, b] = await Promise.all([listener.accept({ timeout: 5000 }), connect(listener.url, { token: TOKEN, timeout: 5000 })]);
    b.send('other address');
    assert.equal(await a.receive({ timeout: 5000 }), 'other address');
    a.close();
    b.close();
  } finally {
    for (const s of held) s.destroy();
    listener.close();
  }
});

test('a Unix listener\'s refusals are coalesced too: connections past maxPending make one event at once and one at close(), counting them all by uid', async () => {
  const name = `flood-${process.pid}`;
  const l = listen(name, { maxPending: 1, refusedIntervalMs: 60_000 });
  const events: Array<[IpcError, RefusedReport]> = [];
  l.on('refused', (e, r) => events.push([e, r]));
  const held = await connect(name, { timeout: 5000 });
  try {
    // Each is told the listener is busy, tries again for 100 ms, and says so: at least 10 refusals.
    for (let i = 0; i < 10; i++) await assert.rejects(connect(name, { timeout: 100 }), code('ERR_LISTENER_BUSY'));
    // Every one was refused by now (each connect was told): one event so far, the first, at once.
    assert.equal(events.length, 1);
    assert.equal(events[0]![0].limit, 'maxPending');
    assert.equal(events[0]![1].count, 1);
    l.close();
    assert.equal(events.length, 2, 'close() reports what was gathered');
    const rest = events[1]![1];
    const uid = `uid ${process.getuid!()}`;
    assert.ok(rest.count >= 9, `the others counted (${rest.count})`);
    assert.deepEqual(rest.byCode, { ERR_LIMIT_REACHED: rest.count });
    assert.deepEqual(rest.bySource, { [uid]: rest.count });
    assert.equal(rest.otherSources, 0);
  } finally {
    held.close();
    l.close();
  }
});

test('refusals within refusedIntervalMs of a report are gathered into one that comes when the interval ends, without close()', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 300 });
  const events: Array<[IpcError, RefusedReport]> = [];
  let wake: (() => void) | undefined;
  listener.on('refused', (e, r) => {
    events.push([e, r]);
    wake?.();
  });
  try {
    for (let i = 0; i < 3; i++) await assert.rejects(connect(listener.url, { token: 'another-token-of-enough-bytes', timeout: 5000 }), code('ERR_AUTH_FAILED'));
    const end = Date.now() + 30_000;
    while (events.reduce((n, [, r]) => n + r.count, 0) < 3) {
      assert.ok(Date.now() < end, 'the gathered report came');
      await new Promise<void>((r) => {
        wake = r;
        setTimeout(r, 1000);
      });
    }
    assert.equal(events[0]![1].count, 1, 'the first at once');
    assert.equal(events[0]![0].code, 'ERR_AUTH_FAILED');
    assert.ok(events.length <= 3);
    assert.equal(events.reduce((n, [, r]) => n + r.count, 0), 3, 'all three counted, none twice');
    for (const [, r] of events) assert.deepEqual(r.bySource, { '127.0.0.1': r.count });
    assert.equal(listener.refusedCount, 3);
  } finally {
    listener.close();
  }
});
