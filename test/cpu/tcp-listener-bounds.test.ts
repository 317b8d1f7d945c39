// The TCP listener's own bounds and life cycle (link/connect/tcp-listener.ts), on loopback: the
// time a connection has to send its challenge and to finish, what one address may hold before it
// proved the token, the sources they count against, close() with connections in every stage,
// and the errors of binding. Issue 41: the mutation run (tcp group) showed these untested; the
// token exchange itself is link-tcp-hostile's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { IpcError } from '../../src/errors.js';
import { connect, listen, type Link, type RefusedReport } from '../../src/link/index.js';
import { TcpListener, sourceOf } from '../../src/link/connect/tcp-listener.js';
import { RawTcp, TOKEN, authenticateRaw, parseFrames, specChallenge, tcpHello, tcpLinkWithRawPeer } from '../fixtures/tcp-peer.js';
import { randomBytes } from 'node:crypto';

const isCode = (c: string) => (e: unknown): boolean => e instanceof IpcError && e.code === c;
const WRONG_TOKEN = 'not-the-listener-token-0123456789';

/** 'refused' events as they come; next() waits for the next one (failing loudly after a generous deadline). */
function refusals(listener: TcpListener): { list: Array<[IpcError, RefusedReport]>; next(): Promise<[IpcError, RefusedReport]> } {
  const list: Array<[IpcError, RefusedReport]> = [];
  let wake: (() => void) | undefined;
  listener.on('refused', (e, r) => {
    list.push([e, r]);
    wake?.();
  });
  return {
    list,
    async next() {
      if (list.length === 0) {
        await new Promise<void>((resolve, reject) => {
          const deadline = setTimeout(() => reject(new Error('no refusal came within 60 s')), 60_000);
          wake = () => {
            clearTimeout(deadline);
            wake = undefined;
            resolve();
          };
        });
      }
      return list.shift()!;
    },
  };
}

/** A silent connection from `localAddress` that the listener admitted (it sent its challenge), or refused (closed it with nothing sent). */
async function silent(port: number, localAddress = '127.0.0.1'): Promise<{ socket: net.Socket; admitted: boolean }> {
  const socket = net.connect({ port, host: '127.0.0.1', localAddress });
  socket.on('error', () => {});
  const admitted = await new Promise<boolean>((resolve) => {
    socket.once('data', () => resolve(true));
    socket.once('close', () => resolve(false));
  });
  return { socket, admitted };
}

test('sourceOf: IPv4 as it is (also IPv4-mapped), IPv6 by its /64 in canonical groups, "unknown" without an address', () => {
  assert.equal(sourceOf(undefined), 'unknown');
  assert.equal(sourceOf(''), 'unknown');
  assert.equal(sourceOf('127.0.0.2'), '127.0.0.2');
  assert.equal(sourceOf('::FFFF:10.1.2.3'), '10.1.2.3');
  assert.equal(sourceOf('::ffff:10.20.30.40'), '10.20.30.40');
  assert.equal(sourceOf('::ffff:1.2.3'), '0:0:0:0::/64', 'not a mapped IPv4 address: an IPv6 one');
  assert.equal(sourceOf('1::ffff:1.2.3.4'), '1:0:0:0::/64', 'ends like a mapped address but is not one');
  assert.equal(sourceOf('2001:0db8:0000:0001::'), '2001:db8:0:1::/64');
  assert.equal(sourceOf('2001:db8::'), '2001:db8:0:0::/64');
  assert.equal(sourceOf('2001:db8:1:2:3:4:5:6'), '2001:db8:1:2::/64');
  assert.equal(sourceOf('2001:db8:1::2:3:4:5'), '2001:db8:1:0::/64', 'one group elided');
  assert.equal(sourceOf('1:2:3:4:5::6'), '1:2:3:4::/64');
  assert.equal(sourceOf('1::2:3:4:5:6:7'), '1:0:2:3::/64');
  // An embedded IPv4 address counts as two groups.
  assert.equal(sourceOf('64:ff9b::1.2.3.4'), '64:ff9b:0:0::/64');
  assert.equal(sourceOf('1::3:4:5:6:1.2.3.4'), '1:0:3:4::/64');
  assert.equal(sourceOf('fe80::1%eth0'), 'fe80:0:0:0::/64');
  assert.equal(sourceOf('fe80:1:2:3::1%eth0'), 'fe80:1:2:3::/64');
});

test('maxPendingPerAddress: one address holds that many unauthenticated places; the next is closed unanswered, other addresses get in, and a place comes back when one leaves', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxPendingPerAddress: 2, maxPending: 10, refusedIntervalMs: 0, handshakeTimeoutMs: 60_000, challengeTimeoutMs: 60_000 });
  const refused = refusals(listener);
  const held: net.Socket[] = [];
  try {
    for (let i = 0; i < 2; i++) {
      const s = await silent(listener.port, '127.0.0.2');
      held.push(s.socket);
      assert.equal(s.admitted, true, `silent connection ${i + 1} of 127.0.0.2 admitted`);
    }
    const third = await silent(listener.port, '127.0.0.2');
    assert.equal(third.admitted, false, 'the third of 127.0.0.2 was closed with nothing sent');
    const [e, report] = await refused.next();
    assert.equal(e.code, 'ERR_LIMIT_REACHED');
    assert.equal(e.limit, 'maxPendingPerAddress');
    assert.match(e.message, new RegExp(`^listener ${listener.url} closed a connection from 127\\.0\\.0\\.2: 2 connections from that address are already authenticating \\(maxPendingPerAddress\\)$`));
    assert.deepEqual(report.bySource, { '127.0.0.2': 1 });
    // Another address is not held up by it: two of its own silent ones, and an honest client.
    const other = await silent(listener.port, '127.0.0.3');
    held.push(other.socket);
    assert.equal(other.admitted, true);
    const [a, b] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN })]);
    b.send('from 127.0.0.1');
    assert.equal(await a.receive(), 'from 127.0.0.1');
    a.close();
    b.close();
    // One of 127.0.0.2's leaves: its place comes back (tried again while the listener has not yet seen the hang-up).
    held.shift()!.destroy();
    let back = await silent(listener.port, '127.0.0.2');
    for (let tries = 1; !back.admitted; tries++) {
      assert.ok(tries < 1000, 'the place of the connection that left came back');
      back = await silent(listener.port, '127.0.0.2');
    }
    held.push(back.socket);
    // That was the one place given back: the next from 127.0.0.2 is closed again.
    const over = await silent(listener.port, '127.0.0.2');
    held.push(over.socket);
    assert.equal(over.admitted, false, '127.0.0.2 holds its two places again');
    // A connection that proved the token no longer counts against its address.
    const proved = await RawTcp.connect(listener.port);
    assert.equal(await authenticateRaw(proved), true);
    const proved2 = await RawTcp.connect(listener.port);
    assert.equal(await authenticateRaw(proved2), true);
    const third1 = await silent(listener.port, '127.0.0.1');
    held.push(third1.socket);
    assert.equal(third1.admitted, true, '127.0.0.1 holds two authenticated connections and one silent');
    proved.destroy();
    proved2.destroy();
  } finally {
    for (const s of held) s.destroy();
    listener.close();
  }
});

test('a connection must send its challenge within challengeTimeoutMs (at most handshakeTimeoutMs), then finish within handshakeTimeoutMs', async () => {
  for (const [options, what, ms] of [
    [{ challengeTimeoutMs: 50, handshakeTimeoutMs: 60_000 }, 'complete TLS and send its challenge \\(challengeTimeoutMs\\)', 50],
    [{ challengeTimeoutMs: 60_000, handshakeTimeoutMs: 60 }, 'complete TLS and send its challenge \\(challengeTimeoutMs\\)', 60],
  ] as const) {
    const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 0, ...options });
    const refused = refusals(listener);
    try {
      const raw = await RawTcp.connect(listener.port);
      await raw.closed();
      const [e] = await refused.next();
      assert.equal(e.code, 'ERR_TIMEOUT');
      assert.match(e.message, new RegExp(`^listener ${listener.url} closed a connection from 127\\.0\\.0\\.1 that did not ${what} within ${ms} ms$`));
      raw.destroy();
    } finally {
      listener.close();
    }
  }
  // The challenge came, then nothing: the handshake's time runs out.
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 0, challengeTimeoutMs: 60_000, handshakeTimeoutMs: 300 });
  const refused = refusals(listener);
  try {
    const raw = await RawTcp.connect(listener.port);
    raw.send(specChallenge(1, randomBytes(32)));
    await raw.closed();
    const [e] = await refused.next();
    assert.equal(e.code, 'ERR_TIMEOUT');
    assert.match(e.message, /that did not complete TLS, the token exchange and the handshake \(handshakeTimeoutMs\) within 300 ms$/);
    raw.destroy();
  } finally {
    listener.close();
  }
});

test('connections are handed to a waiting accept(), a \'connection\' listener, or wait for accept(); close() closes those in every stage and reports none of them', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 0, handshakeTimeoutMs: 60_000, challengeTimeoutMs: 60_000 });
  let refusedEvents = 0;
  listener.on('refused', () => refusedEvents++);
  const mine: Link[] = [];
  try {
    const waiting = listener.accept();
    mine.push(await connect(listener.url, { token: TOKEN }));
    mine.push(await waiting);
    const viaEvent = once(listener, 'connection');
    mine.push(await connect(listener.url, { token: TOKEN }));
    mine.push(((await viaEvent) as [Link])[0]);
    listener.removeAllListeners('connection');
    // Waits for accept(): the next one.
    const unaccepted = await connect(listener.url, { token: TOKEN });
    // One in its token exchange (silent).
    const pending = await silent(listener.port);
    assert.equal(pending.admitted, true);
    const pendingClosed = once(pending.socket, 'close');
    const unacceptedClosed = once(unaccepted, 'close');
    let closes = 0;
    listener.on('close', () => closes++);
    assert.equal(listener.ref().unref().ref(), listener);
    listener.close();
    listener.close();
    assert.equal(closes, 1);
    assert.equal(listener.closed, true);
    await pendingClosed;
    await unacceptedClosed;
    await assert.rejects(listener.accept(), (e: unknown) => isCode('ERR_LINK_CLOSED')(e) && (e as Error).message === `the listener ${listener.url} is closed`);
    assert.equal(listener.unref(), listener, 'closed: nothing to do');
    // Those handed out stay open.
    mine[0]!.send('still open');
    assert.equal(await mine[1]!.receive(), 'still open');
    assert.equal(refusedEvents, 0, 'what close() ended is not a refusal');
    // A connection to the closed listener's port: nobody listens there any more.
    await assert.rejects(connect(listener.url, { token: TOKEN, timeout: 0 }), isCode('ERR_NO_LISTENER'));
    pending.socket.destroy();
    unaccepted.close();
  } finally {
    for (const l of mine) l.close();
    listener.close();
  }
});

test('binding: a port in use is ERR_ADDRESS_IN_USE, an address of no interface here ERR_UNSUPPORTED', async () => {
  const first = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  try {
    await assert.rejects(listen(first.url, { token: TOKEN }), (e: unknown) => isCode('ERR_ADDRESS_IN_USE')(e) && /another socket is bound to tcp:\/\/127\.0\.0\.1:\d+ already/.test((e as Error).message));
  } finally {
    first.close();
  }
  // 192.0.2.0/24 is TEST-NET-1: never this machine's.
  await assert.rejects(listen('tcp://192.0.2.1:0', { token: TOKEN }), (e: unknown) => isCode('ERR_UNSUPPORTED')(e) && /EADDRNOTAVAIL/.test((e as Error).message) && ((e as Error).cause as { code?: string }).code === 'EADDRNOTAVAIL');
  // The system's error otherwise, as it is: a link-local address without its zone (EINVAL; a
  // kernel without IPv6 says EAFNOSUPPORT).
  await assert.rejects(listen('tcp://[fe80::1]:0', { token: TOKEN }), (e: unknown) => !(e instanceof IpcError) && ['EINVAL', 'EAFNOSUPPORT'].includes((e as { code?: string }).code!));
});

test('binding: the port in use is the cause of ERR_ADDRESS_IN_USE', async () => {
  const first = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  try {
    await assert.rejects(listen(first.url, { token: TOKEN }), (e: unknown) => isCode('ERR_ADDRESS_IN_USE')(e) && ((e as Error).cause as { code?: string }).code === 'EADDRINUSE');
  } finally {
    first.close();
  }
});

test('maxPending counts the connections in their handshake and the links waiting for accept(); past it one is closed unanswered and reported', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxPending: 2, refusedIntervalMs: 0, handshakeTimeoutMs: 60_000, challengeTimeoutMs: 60_000 });
  const refused = refusals(listener);
  const held: net.Socket[] = [];
  try {
    const waiting = await connect(listener.url, { token: TOKEN });
    // A wrong token, refused once its proof is read: after the HELLO of `waiting` (sent before it
    // connected), so `waiting` is queued for accept() by then. Its peer is named without a scheme.
    await assert.rejects(connect(listener.url, { token: WRONG_TOKEN }), isCode('ERR_AUTH_FAILED'));
    const [wrong] = await refused.next();
    assert.equal(wrong.code, 'ERR_AUTH_FAILED');
    assert.match(wrong.message, /^the peer at 127\.0\.0\.1:\d+ did not prove the token/);
    const inHandshake = await silent(listener.port);
    held.push(inHandshake.socket);
    assert.equal(inHandshake.admitted, true, 'the second place: one queued link, one in its handshake');
    const third = await silent(listener.port);
    held.push(third.socket);
    assert.equal(third.admitted, false, 'the third was closed with nothing sent');
    const [e, report] = await refused.next();
    assert.equal(e.code, 'ERR_LIMIT_REACHED');
    assert.equal(e.limit, 'maxPending');
    assert.equal(e.message, `listener ${listener.url} closed a connection from 127.0.0.1: 2 connections are already in their handshake or waiting for accept() (maxPending)`);
    assert.deepEqual(report.bySource, { '127.0.0.1': 1 });
    assert.equal(listener.refusedCount, 2, 'the wrong token and the one past maxPending');
    // The queued link is the next accept()'s.
    const server = await listener.accept({ timeout: 30_000 });
    waiting.send('queued');
    assert.equal(await server.receive({ timeout: 30_000 }), 'queued');
    server.close();
    waiting.close();
  } finally {
    for (const s of held) s.destroy();
    listener.close();
  }
});

test('links waiting for accept() are taken in order, before a \'connection\' listener added meanwhile gets any; for await and using', async () => {
  let outer: TcpListener | undefined;
  let iterator: AsyncIterator<Link> | undefined;
  const links: Link[] = [];
  try {
    using listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 0 });
    outer = listener;
    const refused = refusals(listener);
    // A refused wrong token after each connect(): the listener read that link's HELLO before it.
    const settled = async (): Promise<void> => {
      await assert.rejects(connect(listener.url, { token: WRONG_TOKEN }), isCode('ERR_AUTH_FAILED'));
      assert.equal((await refused.next())[0].code, 'ERR_AUTH_FAILED');
    };
    const first = await connect(listener.url, { token: TOKEN });
    links.push(first);
    await settled();
    const events: Link[] = [];
    listener.on('connection', (l) => events.push(l));
    const second = await connect(listener.url, { token: TOKEN });
    links.push(second);
    await settled();
    assert.equal(events.length, 0, 'the second waits behind the first, not handed to the listener');
    iterator = listener[Symbol.asyncIterator]();
    const a = (await iterator.next()).value as Link;
    const b = (await iterator.next()).value as Link;
    links.push(a, b);
    first.send('first');
    second.send('second');
    assert.equal(await a.receive({ timeout: 30_000 }), 'first');
    assert.equal(await b.receive({ timeout: 30_000 }), 'second');
    // The queue empty, the next goes to the listener.
    const viaEvent = once(listener, 'connection');
    links.push(await connect(listener.url, { token: TOKEN }));
    await viaEvent;
    assert.equal(events.length, 1);
    links.push(events[0]!);
  } finally {
    for (const l of links) l.close();
  }
  // `using` closed it; its iterator ends; ref() and unref() on a closed listener do nothing.
  assert.equal(outer!.closed, true);
  assert.deepEqual(await iterator!.next(), { done: true, value: undefined });
  assert.equal(outer!.ref(), outer);
  assert.equal(outer!.unref(), outer);
});

test('a link handed out is not closed when the handshake timeout its connection started with runs out', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, refusedIntervalMs: 0, handshakeTimeoutMs: 300, challengeTimeoutMs: 300 });
  const refused = refusals(listener);
  try {
    const [server, client] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN })]);
    // A silent connection made after it: its timeout ends after the first one's would have.
    const late = await silent(listener.port);
    assert.equal(late.admitted, true);
    const [e] = await refused.next();
    assert.equal(e.code, 'ERR_TIMEOUT');
    late.socket.destroy();
    assert.equal(server.closed, false);
    client.send('after the timeout');
    assert.equal(await server.receive({ timeout: 30_000 }), 'after the timeout');
    server.close();
    client.close();
  } finally {
    listener.close();
  }
});

test('the listener sends its HELLO right after its proof, without waiting for the peer\'s (PROTOCOL.md 2.3, step 5)', async () => {
  const { listener, raw, link } = await tcpLinkWithRawPeer({ handshakeTimeoutMs: 60_000 });
  try {
    const frames = parseFrames(await raw.take(24));
    assert.deepEqual(frames.map((f) => f.type), [1], 'a HELLO came before this side sent anything');
    raw.send(tcpHello());
    const server = await link;
    assert.equal(server.closed, false);
    server.close();
  } finally {
    raw.destroy();
    listener.close();
  }
});

test('a TcpListener is made by listen(url) only', () => {
  assert.throws(() => new TcpListener(Symbol('not the key') as never, net.createServer(), 'tcp://127.0.0.1:1' as never, {} as never), (e: unknown) => e instanceof TypeError && e.message === 'use listen(url) to create a TcpListener');
});
