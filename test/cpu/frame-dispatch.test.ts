// What the receiving side of a link (link/connection/frame-dispatch.ts) does with each record, at
// the seam the Link gives it (FrameDispatchParts): which frames close the link and with which
// error code, which fail one message, what reaches the inbox, the leases and the hooks, and that
// every fd of a refused record is closed. Issue 41: the mutation run showed these checks untested
// (the link tests reach them only through whole links, most not at all).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import '../../src/link/index.js'; // registers the transfer handlers
import { FrameDispatch, type FrameDispatchParts } from '../../src/link/connection/frame-dispatch.js';
import type { LinkState } from '../../src/link/connection/link-types.js';
import type { ReceivedMessage } from '../../src/link/connection/inbound.js';
import { IncomingLeases, OutgoingLeases } from '../../src/link/lifetimes/lease.js';
import { registerGoneHandler } from '../../src/link/lifetimes/gone.js';
import { encodeNcclAbort, type NcclAbort } from '../../src/link/messages/nccl-abort.js';
import {
  FrameType,
  HEADER_BYTES,
  LARGE_PAYLOAD,
  MAX_FDS,
  MAX_FRAME_BYTES,
  RefuseReason,
  encodeGone,
  encodeRefuse,
  encodeRelease,
  writeHeader,
} from '../../src/link/transport/frame.js';
import { RecordSource } from '../../src/link/transport/unix-transport.js';
import type { FrameTransport } from '../../src/link/transport/frame-transport.js';
import { addon } from '../../src/native/addon.js';
import { fdIsOpen } from '../fixtures/fd-count.js';

/** A whole frame: header and payload. */
function frame(type: FrameType, flags: number, payload: Uint8Array | string = new Uint8Array(0), fdCount = 0): Uint8Array {
  const body = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const f = new Uint8Array(HEADER_BYTES + body.byteLength);
  writeHeader(new DataView(f.buffer), type, flags, body.byteLength, fdCount);
  f.set(body, HEADER_BYTES);
  return f;
}
const json = (text: string): Uint8Array => frame(FrameType.Message, 0, text);
const hello = (features: number): Uint8Array => {
  const p = new Uint8Array(8);
  new DataView(p.buffer).setUint32(0, features, true);
  return frame(FrameType.Hello, 0, p);
};
/** A JsonWithRecords payload whose records are handler kinds with `fds` fds each and the given lease ids. */
function leasedPayload(leases: number[], fdsEach = 1, kindName = 'host-buffer'): Uint8Array {
  const parts: number[] = [];
  const jsonText = Buffer.from(JSON.stringify(leases.map(() => null)));
  const u32 = (n: number): number[] => [n & 0xff, (n >>> 8) & 0xff, (n >>> 16) & 0xff, n >>> 24];
  parts.push(...u32(jsonText.length), ...jsonText, leases.length & 0xff, leases.length >>> 8);
  leases.forEach((id, i) => {
    const kind = Buffer.from(kindName);
    parts.push(kind.length, ...kind, 1, 0, ...u32(i), fdsEach, ...u32(id), ...u32(0), ...u32(0));
  });
  return new Uint8Array(parts);
}

type Shutdown = { reason: IpcError | undefined; by: 'local' | 'peer' };

function harness(opts: { state?: LinkState; kind?: 'unix' | 'tcp'; maxMessageBytes?: number } = {}) {
  const link = { state: opts.state ?? 'open' } as { state: LinkState };
  const recvBuffer = new ArrayBuffer(MAX_FRAME_BYTES);
  const ringBuffer = Buffer.alloc(MAX_FRAME_BYTES);
  const shutdowns: Shutdown[] = [];
  const delivered: Array<{ message: ReceivedMessage; bytes: number; fds: number }> = [];
  const hellos: Array<{ cred: [number, number, number] | undefined; features: number }> = [];
  const aborts: NcclAbort[] = [];
  const sent: Array<string | number> = [];
  const refusals: Array<{ reason: number; text: string }> = [];
  const offers: Array<{ capacity: number; fds: [number, number] }> = [];
  const released: number[] = [];
  const sock = {
    kind: opts.kind ?? 'unix',
    recvBuffer,
    ringBuffer,
    ringView: new DataView(ringBuffer.buffer, ringBuffer.byteOffset, ringBuffer.byteLength),
    offer: (capacity: number, fds: [number, number]): boolean => {
      offers.push({ capacity, fds });
      return true;
    },
    acceptOffer(capacity: number, fds: [number, number]): boolean {
      return this.offer(capacity, fds);
    },
    start: (): void => {
      sent.push('startReceiving');
    },
    startReceiving(): void {
      this.start();
    },
  };
  const sender = {
    control: (type: number): void => {
      sent.push(type);
    },
    sendControl(type: number): void {
      this.control(type);
    },
    sendRefusal: (reason: number, text: string): void => void refusals.push({ reason, text }),
    maybeDrain: (): void => void sent.push('drain'),
  };
  const leasesIn = new IncomingLeases((ids) => released.push(...ids));
  const leasesOut = new OutgoingLeases({ id: 1, peer: { pid: 1 } });
  const parts: FrameDispatchParts = {
    link,
    sock: sock as unknown as FrameTransport,
    sender: sender as unknown as FrameDispatchParts['sender'],
    inbox: { deliver: (message: ReceivedMessage, bytes: number, fds: number) => void delivered.push({ message, bytes, fds }) } as unknown as FrameDispatchParts['inbox'],
    leasesOut,
    leasesIn,
    maxMessageBytes: opts.maxMessageBytes ?? 1 << 20,
    peerName: 'test peer',
    hello: (cred, features) => void hellos.push({ cred, features }),
    shutdown: (reason, by) => void shutdowns.push({ reason, by }),
    ncclAbort: (abort) => void aborts.push(abort),
  };
  const dispatch = new FrameDispatch(parts);
  return {
    link, sock, sender, leasesIn, leasesOut, shutdowns, delivered, hellos, aborts, sent, refusals, offers, released,
    /** The record as the transport hands it over: in its receive buffer (or its ring buffer). */
    receive(bytes: Uint8Array, fds?: number[], o: { status?: number; source?: RecordSource; cred?: [number, number, number]; length?: number } = {}): void {
      const into = o.source === RecordSource.Ring ? ringBuffer : new Uint8Array(recvBuffer);
      into.set(bytes);
      dispatch.record(o.status ?? 0, o.length ?? bytes.byteLength, fds, o.cred, o.source ?? RecordSource.Socket);
    },
  };
}

function memfds(n: number): number[] {
  return Array.from({ length: n }, () => addon.memfdCreate('dispatch-test'));
}
function closeAll(fds: number[]): void {
  for (const fd of fds) if (fdIsOpen(fd)) addon.close(fd);
}
function onlyShutdown(h: ReturnType<typeof harness>, code: string | undefined, by: 'local' | 'peer', message?: RegExp): IpcError | undefined {
  assert.equal(h.shutdowns.length, 1, `one shutdown, got ${h.shutdowns.map((s) => s.reason?.code).join(', ')}`);
  const s = h.shutdowns[0]!;
  assert.equal(s.reason?.code, code);
  assert.equal(s.by, by);
  if (message) assert.match(s.reason!.message, message);
  assert.equal(h.delivered.length, 0);
  return s.reason;
}

test('a record for a closed link: its fds are closed and nothing else happens', () => {
  const h = harness({ state: 'closed' });
  const fds = memfds(1);
  h.receive(frame(FrameType.Message, 2, leasedPayload([0]), 1), fds);
  h.receive(hello(0));
  h.receive(json('1'), undefined, { status: 1 });
  assert.equal(fdIsOpen(fds[0]!), false);
  assert.deepEqual([h.shutdowns.length, h.delivered.length, h.hellos.length], [0, 0, 0]);
});

test('records the transport could not read whole close the link: too large, or fds cut short', () => {
  const big = harness();
  big.receive(json('1'), undefined, { status: 1 });
  onlyShutdown(big, 'ERR_FRAME_INVALID', 'local', new RegExp(`the test peer sent a record larger than ${MAX_FRAME_BYTES} bytes`));
  for (const status of [2, 3]) {
    const h = harness();
    // A sound message header announcing one fd, which the kernel dropped (status 3: also too large).
    h.receive(frame(FrameType.Message, 2, leasedPayload([7]), 1), undefined, { status });
    if (status === 2) {
      assert.equal(h.shutdowns.length, 0, 'fds lost here: the message fails, the link goes on');
      assert.equal(h.delivered.length, 1);
    } else {
      onlyShutdown(h, 'ERR_FDS_TRUNCATED', 'local', /the test peer sent a message with more fds than a link accepts/);
    }
  }
});

test('fds lost here (EMFILE): only that message fails with ERR_FD_LIMIT and its leases go back', async () => {
  const h = harness();
  h.leasesIn.open(6); // a live lease the peer (wrongly) names again: not ended on its behalf
  h.receive(frame(FrameType.Message, 2, leasedPayload([5, 6, 0]), 3), undefined, { status: 2 });
  assert.equal(h.shutdowns.length, 0);
  assert.equal(h.delivered.length, 1);
  const d = h.delivered[0]!;
  assert.deepEqual([d.bytes, d.fds, d.message.ok], [0, 0, false]);
  assert.ok(!d.message.ok && d.message.error.code === 'ERR_FD_LIMIT');
  assert.match(d.message.error.message, /a message from the test peer carried 3 fds, and this process had no descriptor left for them/);
  await Promise.resolve(); // the RELEASE goes out on a microtask queued before this one
  assert.deepEqual(h.released, [5], 'lease 5 went back; 6 was live already and stays');
  assert.equal(h.leasesIn.isLive(6), true);
  assert.equal(h.leasesIn.isLive(5), false);

  // As many fds as a record may carry: still lost here.
  const max = harness();
  max.receive(frame(FrameType.Message, 2, leasedPayload(Array.from({ length: MAX_FDS }, () => 0)), MAX_FDS), undefined, { status: 2 });
  assert.deepEqual([max.shutdowns.length, max.delivered.length], [0, 1]);

  // A large message's payload was in the lost memfd: its leases are unknowable, the link closes.
  const large = harness();
  large.receive(frame(FrameType.Message, LARGE_PAYLOAD | 2, new Uint8Array(8), 2), undefined, { status: 2 });
  onlyShutdown(large, 'ERR_FD_LIMIT', 'local');
});

test('fds cut short on anything but a sound open-link message with 1..MAX_FDS fds: ERR_FDS_TRUNCATED', () => {
  const cases: Array<[string, Uint8Array, LinkState?, number?]> = [
    ['a record shorter than a header', json('1').subarray(0, 10)],
    ['a header out of spec', frame(FrameType.Message, 2, leasedPayload([0]), 1).map((b, i) => (i === 0 ? 0 : b))],
    ['a RING frame', frame(FrameType.Ring, 0, new Uint8Array(8), 2)],
    ['a message announcing no fds', json('1')],
    ['a message announcing more fds than a record carries', frame(FrameType.Message, 2, leasedPayload(Array.from({ length: MAX_FDS + 1 }, () => 0)), MAX_FDS + 1)],
    ['a message with malformed records', frame(FrameType.Message, 2, leasedPayload([0]).subarray(0, 12), 1)],
    ['a message naming one lease twice', frame(FrameType.Message, 2, leasedPayload([4, 4]), 2)],
    ['a message before the handshake', frame(FrameType.Message, 2, leasedPayload([0]), 1), 'handshaking'],
  ];
  for (const [what, bytes, state] of cases) {
    const h = harness({ state: state ?? 'open' });
    h.receive(bytes, undefined, { status: 2 });
    assert.equal(h.shutdowns.length, 1, what);
    assert.equal(h.shutdowns[0]!.reason?.code, 'ERR_FDS_TRUNCATED', what);
    assert.equal(h.delivered.length, 0, what);
    assert.equal(h.leasesIn.count, 0, what);
  }
});

test('a header out of spec closes the link with ERR_FRAME_INVALID and closes the fds that came', () => {
  const h = harness();
  const fds = memfds(2);
  const bad = frame(FrameType.Message, 2, leasedPayload([0, 0]), 2);
  bad[4] = 9; // version
  h.receive(bad, fds);
  onlyShutdown(h, 'ERR_FRAME_INVALID', 'local', /protocol version 9/);
  assert.deepEqual(fds.map(fdIsOpen), [false, false]);
});

test('before the handshake only HELLO, REFUSE and GOODBYE are taken; anything else closes the link, naming it', () => {
  const abortFrame = encodeNcclAbort(new Uint8Array(16), 1, 'x');
  const cases: Array<[string, Uint8Array, number]> = [
    ['message', json('1'), 0],
    ['message', frame(FrameType.Message, 2, leasedPayload([0]), 1), 1],
    ['RELEASE', encodeRelease([1]), 0],
    ['GONE', encodeGone([{ kind: 'k', key: new Uint8Array([1]) }])[0]!, 0],
    ['RING', frame(FrameType.Ring, 0, new Uint8Array(8), 2), 2],
    ['RING_START', frame(FrameType.RingStart, 0), 0],
    ['NCCL_ABORT', abortFrame, 0],
  ];
  for (const [what, bytes, n] of cases) {
    const h = harness({ state: 'handshaking', kind: 'tcp' });
    const fds = memfds(n);
    h.receive(bytes, n ? fds : undefined);
    onlyShutdown(h, 'ERR_FRAME_INVALID', 'local', new RegExp(`^the test peer sent a ${what} before the link handshake$`));
    assert.deepEqual(fds.map(fdIsOpen), fds.map(() => false), `${what}: its fds were closed`);
    assert.deepEqual([h.offers.length, h.sent.length, h.aborts.length], [0, 0, 0]);
  }
  const h = harness({ state: 'handshaking' });
  h.receive(hello(5), undefined, { cred: [10, 20, 30] });
  assert.deepEqual(h.hellos, [{ cred: [10, 20, 30], features: 5 }]);
  h.receive(frame(FrameType.Goodbye, 0));
  onlyShutdown(h, undefined, 'peer');
  const r = harness({ state: 'handshaking' });
  r.receive(encodeRefuse(RefuseReason.Uid, 'not you'));
  onlyShutdown(r, 'ERR_PEER_REFUSED', 'peer', /^the test peer refused the link: not you$/);
});

test('REFUSE: its reason decides the error code the link closes with', () => {
  const cases: Array<[RefuseReason | number, string, RegExp]> = [
    [RefuseReason.TooLarge, 'ERR_MESSAGE_TOO_LARGE', /^the test peer closed the link on a message larger than it accepts: why$/],
    [RefuseReason.Busy, 'ERR_LISTENER_BUSY', /^the test peer is busy: why$/],
    [RefuseReason.Uid, 'ERR_PEER_REFUSED', /^the test peer refused the link: why$/],
    [RefuseReason.Protocol, 'ERR_PEER_REFUSED', /^the test peer refused the link: why$/],
    [99, 'ERR_PEER_REFUSED', /^the test peer refused the link: why$/],
  ];
  for (const [reason, code, message] of cases) {
    const h = harness();
    h.receive(encodeRefuse(reason, 'why'));
    const e = onlyShutdown(h, code, 'peer', message);
    assert.equal(e?.limit, reason === RefuseReason.TooLarge ? 'maxMessageBytes' : undefined);
  }
});

test('messages reach the inbox from the socket or the ring; a malformed one closes the link; one past maxMessageBytes is refused back', () => {
  const h = harness();
  h.receive(json('{"a":[1,2]}'));
  // From the ring: the bytes are in the ring buffer; the receive buffer holds something else.
  new Uint8Array(h.sock.recvBuffer).set(json('"not this"'));
  h.receive(json('"from the ring"'), undefined, { source: RecordSource.Ring });
  assert.equal(h.shutdowns.length, 0);
  assert.deepEqual(
    h.delivered.map((d) => [d.message.ok && d.message.value, d.bytes, d.fds]),
    [[{ a: [1, 2] }, 11, 0], ['from the ring', 15, 0]],
  );
  // A message that fails alone (no handler for its kind) is delivered as a failure; the link goes on.
  h.receive(frame(FrameType.Message, 2, leasedPayload([0], 0, 'nobody-knows-this-kind')));
  assert.equal(h.shutdowns.length, 0);
  const lone = h.delivered[2]!;
  assert.ok(!lone.message.ok && lone.message.error.code === 'ERR_NOT_TRANSFERABLE');
  assert.deepEqual([lone.bytes, lone.fds], [0, 0]);

  const bad = harness();
  const fds = memfds(1);
  bad.receive(frame(FrameType.Message, 2, leasedPayload([0]).subarray(0, 12), 1), fds);
  onlyShutdown(bad, 'ERR_FRAME_INVALID', 'local', /received a malformed message payload/);
  assert.equal(fdIsOpen(fds[0]!), false);
  assert.equal(bad.refusals.length, 0, 'only a message too large is refused back');

  const small = harness({ maxMessageBytes: 4 });
  small.receive(json('"12345"'));
  const e = onlyShutdown(small, 'ERR_MESSAGE_TOO_LARGE', 'local');
  assert.deepEqual(small.refusals, [{ reason: RefuseReason.TooLarge, text: e!.message }]);
});

test('RELEASE ends the leases it names and lets the sender drain; an id never granted closes the link', () => {
  const h = harness();
  const ran: number[] = [];
  for (const id of [41, 42, 43]) h.leasesOut.add(id, { release: () => void ran.push(id) });
  h.receive(encodeRelease([41, 43]));
  assert.deepEqual(ran, [41, 43]);
  assert.deepEqual(h.sent, ['drain']);
  assert.equal(h.shutdowns.length, 0);
  h.receive(encodeRelease([42, 41]));
  assert.deepEqual(ran, [41, 43, 42]);
  onlyShutdown(h, 'ERR_FRAME_INVALID', 'local', /^the test peer released lease 41, which this link never granted or had already ended$/);
  assert.deepEqual(h.sent, ['drain', 'drain']);
});

test('HELLO, GONE, NCCL_ABORT and GOODBYE reach their parts', () => {
  const h = harness({ kind: 'tcp' });
  h.receive(hello(3), undefined, { cred: [1, 2, 3] });
  h.receive(hello(0));
  assert.deepEqual(h.hellos, [{ cred: [1, 2, 3], features: 3 }, { cred: undefined, features: 0 }]);

  const seen: Array<[number[], object]> = [];
  const off = registerGoneHandler('dispatch-test-kind', (key, l) => void seen.push([[...key], l]));
  h.receive(encodeGone([{ kind: 'dispatch-test-kind', key: new Uint8Array([7, 8]) }, { kind: 'other-kind', key: new Uint8Array([1]) }])[0]!);
  off();
  assert.deepEqual(seen, [[[7, 8], h.link]]);

  const id = new Uint8Array(16).fill(9);
  h.receive(encodeNcclAbort(id, 2, 'peer gave up'));
  assert.equal(h.aborts.length, 1);
  assert.deepEqual([[...h.aborts[0]!.id], h.aborts[0]!.reason, h.aborts[0]!.text], [[...id], 2, 'peer gave up']);
  assert.equal(h.shutdowns.length, 0);

  // On a Unix-socket link NCCL_ABORT is out of protocol.
  const u = harness({ kind: 'unix' });
  u.receive(encodeNcclAbort(id, 1, 'x'));
  onlyShutdown(u, 'ERR_FRAME_INVALID', 'local', /^the test peer sent NCCL_ABORT on a Unix-socket link$/);
  assert.equal(u.aborts.length, 0);

  h.receive(frame(FrameType.Goodbye, 0));
  onlyShutdown(h, undefined, 'peer');
});

test('RING and RING_START: an accepted offer is answered, a refused one is not; a failure closes the link', () => {
  const ringFrame = (capacity: number): Uint8Array => {
    const p = new Uint8Array(8);
    new DataView(p.buffer).setUint32(0, capacity, true);
    return frame(FrameType.Ring, 0, p, 2);
  };
  const h = harness();
  h.receive(ringFrame(1 << 16), [101, 102]);
  assert.deepEqual(h.offers, [{ capacity: 1 << 16, fds: [101, 102] }]);
  assert.deepEqual(h.sent, [FrameType.RingStart]);

  const refused = harness();
  refused.sock.offer = () => false;
  refused.receive(ringFrame(4096), [103, 104]);
  assert.deepEqual([refused.sent, refused.shutdowns], [[], []]);

  const failing = harness();
  const why = new IpcError('ERR_FRAME_INVALID', 'the offered ring is not a ring');
  failing.sock.offer = () => {
    throw why;
  };
  failing.receive(ringFrame(4096), [105, 106]);
  assert.deepEqual(failing.shutdowns, [{ reason: why, by: 'local' }]);
  assert.deepEqual(failing.sent, []);

  // The answer cannot be sent: the peer is gone, which the receive side reports; no throw here.
  const gone = harness();
  gone.sender.control = () => {
    throw new IpcError('ERR_PEER_GONE', 'gone');
  };
  gone.receive(ringFrame(4096), [107, 108]);
  assert.deepEqual([gone.offers.length, gone.shutdowns.length], [1, 0]);

  h.receive(frame(FrameType.RingStart, 0));
  assert.deepEqual(h.sent, [FrameType.RingStart, 'startReceiving']);
  assert.equal(h.shutdowns.length, 0);
  const cannot = harness();
  const err = new IpcError('ERR_FRAME_INVALID', 'no ring offered');
  cannot.sock.start = () => {
    throw err;
  };
  cannot.receive(frame(FrameType.RingStart, 0));
  assert.deepEqual(cannot.shutdowns, [{ reason: err, by: 'local' }]);
});
