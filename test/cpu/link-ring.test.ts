// Frame rings (src/link/transport/frame-ring.ts, unix-transport.ts): the ring itself (wrap-around, room,
// the doorbell protocol, a corrupt ring), links that agree on rings (order against socket frames
// with fds, backpressure, a clean close and a killed peer through the ring), and peers that do
// not take rings (a link with them off, a Python peer), and hostile RING frames.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { HostBuffer } from '../../src/host/index.js';
import { spawn, spawnPython, type Link } from '../../src/link/index.js';
import { kRingState } from '../../src/link/connection/link.js';
import { EntryKind, RingReader, RingWriter, RING_DATA_OFFSET } from '../../src/link/transport/frame-ring.js';
import { endianness } from 'node:os';
import { addon } from '../../src/native/addon.js';
import { fdCount } from '../fixtures/fd-count.js';
import { header, linkPair, linkWithRawPeer, makeLink, ringsUp } from '../fixtures/link-pair.js';
import { noPython, pythonFixture } from '../helpers/python.js';

const CHILD = new URL('../fixtures/ring-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
// Rings are off by default (unix-transport.ts says why): every test here asks for them.
const skip = endianness() === 'LE' ? undefined : 'frame rings need a little-endian machine';

function pair(capacity = 4096): { reader: RingReader; writer: RingWriter } {
  const reader = new RingReader(capacity);
  const writer = new RingWriter(addon.dup(reader.fd), capacity);
  reader.closeFd();
  return { reader, writer };
}

function closeReason(link: Link): Promise<{ code?: string } | undefined> {
  return new Promise((resolve) => link.once('close', (reason) => resolve(reason)));
}

test('a frame ring carries frames of every size in order across many wrap-arounds', () => {
  const { reader, writer } = pair(4096);
  try {
    assert.equal(writer.maxFrame, 1024);
    let sent = 0;
    let got = 0;
    const expected: Array<{ kind: EntryKind; bytes?: Uint8Array }> = [];
    for (let round = 0; round < 3000; round++) {
      // Write until full, with SOCKET entries in between, then read everything back.
      for (;;) {
        const socketEntry = sent % 7 === 5;
        const length = socketEntry ? 0 : 1 + ((sent * 37) % 1024);
        if (!writer.fits(length)) break;
        if (socketEntry) {
          writer.put(EntryKind.Socket, null, 0, null);
          expected.push({ kind: EntryKind.Socket });
        } else {
          const bytes = new Uint8Array(length).map((_, i) => (i * 7 + sent) & 0xff);
          const split = length >> 1;
          writer.put(EntryKind.Frame, bytes.subarray(0, split).slice(), split, length > split ? bytes.subarray(split) : null);
          expected.push({ kind: EntryKind.Frame, bytes });
        }
        sent++;
        // The first publish after the reader armed asks for a ring; later ones do not.
        const ring = writer.publish();
        if (round === 0 && sent === 1) assert.equal(ring, true, 'a new ring starts armed');
        else if (round === 0) assert.equal(ring, false);
      }
      while (reader.next()) {
        const e = expected.shift()!;
        assert.equal(reader.kind, e.kind, `entry ${got}`);
        if (e.bytes) assert.deepEqual(new Uint8Array(reader.data.subarray(reader.frameStart, reader.frameStart + reader.frameLength)), e.bytes);
        reader.consume();
        got++;
      }
      assert.equal(reader.arm(), false, 'nothing more was published');
      assert.equal(writer.publish(), true, 'an armed reader is rung once');
      assert.equal(writer.publish(), false);
    }
    assert.equal(got, sent);
    assert.equal(expected.length, 0);
    assert.ok(sent > 3000 * 4, `${sent} entries`);
  } finally {
    reader.close();
    writer.close();
  }
});

test('a full ring says so, the writer waits, and the reader knows to ring it back', () => {
  const { reader, writer } = pair(4096);
  try {
    let n = 0;
    while (writer.fits(1000)) {
      writer.put(EntryKind.Frame, new Uint8Array(1000), 1000, null);
      n++;
    }
    writer.publish();
    assert.equal(n, 4);
    assert.equal(reader.takeWriterWaiting(), false);
    assert.equal(writer.fitsOrWait(1000), false);
    assert.equal(reader.next(), true);
    reader.consume();
    assert.equal(reader.takeWriterWaiting(), true, 'the writer asked to be rung');
    assert.equal(reader.takeWriterWaiting(), false, 'once');
    assert.equal(writer.fits(1000), true);
    assert.equal(writer.readerClosed, false);
  } finally {
    reader.close();
    assert.equal(writer.readerClosed, true, 'a reader that closed says so');
    writer.close();
  }
});

test('a corrupt ring is refused with ERR_FRAME_INVALID, never read out of bounds', () => {
  const scribbles: Array<[string, (words: Int32Array, data: DataView) => void]> = [
    ['tail past capacity', (w) => Atomics.store(w, 16, 8192)],
    ['tail not aligned', (w) => Atomics.store(w, 16, 12)],
    ['unknown kind', (w, d) => { d.setUint32(4, 9, true); Atomics.store(w, 16, 16); }],
    ['frame past the published bytes', (w, d) => { d.setUint32(0, 100, true); d.setUint32(4, 1, true); Atomics.store(w, 16, 16); }],
    ['frame larger than a quarter of the ring', (w, d) => { d.setUint32(0, 2048, true); d.setUint32(4, 1, true); Atomics.store(w, 16, 4096); }],
    ['empty frame', (w, d) => { d.setUint32(0, 0, true); d.setUint32(4, 1, true); Atomics.store(w, 16, 8); }],
    ['misplaced pad', (w, d) => { d.setUint32(0, 0, true); d.setUint32(4, 3, true); Atomics.store(w, 16, 8); }],
  ];
  for (const [what, scribble] of scribbles) {
    const reader = new RingReader(4096);
    // What a hostile writer can do: write anything into the shared mapping.
    const memory = new addon.SharedMemory(addon.dup(reader.fd), RING_DATA_OFFSET + 4096);
    const ab = memory.arrayBuffer(0, RING_DATA_OFFSET + 4096);
    scribble(new Int32Array(ab, 0, 1024), new DataView(ab, RING_DATA_OFFSET));
    assert.throws(() => reader.next(), code('ERR_FRAME_INVALID'), what);
    memory.close();
    reader.close();
  }
  // Offers that cannot be mapped safely: an unsealed file, a short one, a bad header, a bad size.
  const unsealed = addon.memfdCreate('ring', RING_DATA_OFFSET + 4096);
  const short = addon.memfdCreate('ring', 4096, addon.posixConstants.F_SEAL_SHRINK);
  const zeros = addon.memfdCreate('ring', RING_DATA_OFFSET + 4096, addon.posixConstants.F_SEAL_SHRINK);
  const before = fdCount();
  for (const [fd, capacity] of [[unsealed, 4096], [short, 4096], [zeros, 4096], [addon.dup(zeros), 3000]] as const) {
    assert.throws(() => new RingWriter(fd, capacity), code('ERR_FRAME_INVALID'));
  }
  assert.equal(fdCount(), before - 3, 'each offered fd was closed');
});

test('linked processes agree on rings; frames through the ring and frames with fds by the socket arrive in the order sent', { skip }, async () => {
  const { child, link } = await spawn(CHILD, [], { frameRing: true });
  try {
    await ringsUp(link);
    link.send({ op: 'state' });
    assert.deepEqual(await link.receive(), { sending: true, receiving: true });
    link.send({ op: 'echo-all' });
    assert.equal(await link.receive(), 'echoing');
    // Small messages (ring), host buffers (socket, with their fd), raw messages larger than a
    // quarter of the ring (socket), sent back to back: the echo must come back in order.
    const n = 3000;
    const buffers: HostBuffer[] = [];
    for (let i = 0; i < n; i++) {
      if (i % 5 === 1) {
        const b = HostBuffer.allocate(4096);
        b.bytes[9] = i & 0xff;
        buffers.push(b);
        link.send({ i, b });
      } else if (i % 11 === 4) {
        const raw = new Uint8Array(20_000);
        new DataView(raw.buffer).setUint32(0, i, true);
        link.send(raw);
      } else {
        link.send({ i, pad: 'x'.repeat(i % 900) });
      }
    }
    assert.ok(link.pendingSends > 0, 'the burst outran the peer: frames waited for room');
    for (let i = 0; i < n; i++) {
      const m = (await link.receive({ signal: AbortSignal.timeout(20_000) })) as any;
      if (m instanceof Uint8Array) {
        assert.equal(new DataView(m.buffer, m.byteOffset).getUint32(0, true), i);
      } else {
        assert.equal(m.i, i);
        if (m.b) {
          assert.equal(m.b.bytes[9], i & 0xff);
          m.b.close();
        }
      }
    }
    await link.flush();
    for (const b of buffers) b.close();
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('through the ring, a clean end reads as a clean close and a killed peer as ERR_PEER_GONE, after every frame it sent', { skip }, async () => {
  for (const then of ['end', 'kill'] as const) {
    const { child, link } = await spawn(CHILD, [], { frameRing: true });
    try {
      await ringsUp(link);
      const closed = closeReason(link);
      link.send({ op: 'burst', n: 50, then });
      for (let seq = 0; seq < 50; seq++) {
        const m = (await link.receive({ signal: AbortSignal.timeout(10_000) })) as any;
        if (m instanceof Uint8Array) assert.equal(new DataView(m.buffer, m.byteOffset).getUint32(0, true), seq);
        else {
          assert.equal(m.seq, seq);
          if (m.buffer) {
            assert.equal(m.buffer.bytes[0], seq);
            m.buffer.close();
          }
        }
      }
      if (then === 'end') {
        await assert.rejects(link.receive(), (e: unknown) => code('ERR_LINK_CLOSED')(e) && /closed the link/.test((e as Error).message));
        assert.equal(await closed, undefined);
      } else {
        await assert.rejects(link.receive(), code('ERR_PEER_GONE'));
        assert.equal((await closed)?.code, 'ERR_PEER_GONE');
      }
    } finally {
      link.close();
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
    }
  }
});

test('through the rings, a reader at its inbox bound stops reading its ring; the writer waits in its send queue: send() false, ERR_SEND_QUEUE_FULL at the bound, every message in order, then drain', { skip }, async () => {
  const [a, b] = await linkPair({ frameRing: true, sendQueue: { messages: 50 } }, { frameRing: true, inbox: { messages: 4 } });
  try {
    assert.deepEqual(a[kRingState](), { sending: true, receiving: true });
    const pad = 'x'.repeat(200);
    let sent = 0;
    let waited = 0;
    let error: unknown;
    try {
      for (let i = 0; i < 100_000; i++) {
        if (!a.send({ i, pad })) waited++;
        sent++;
        // Let b read what it will: it stops at its inbox bound, and the ring then fills.
        if (i % 64 === 0) await new Promise((r) => setImmediate(r));
      }
    } catch (e) {
      error = e;
    }
    assert.equal((error as { code?: string })?.code, 'ERR_SEND_QUEUE_FULL', String(error));
    assert.equal((error as { limit?: string }).limit, 'sendQueue.messages');
    assert.equal(a.sendQueue.messages, 50, 'the queue holds what waits for ring room');
    assert.ok(waited >= 50 && sent > 4 + 50, `${sent} sent, ${waited} of them waited: more than the inbox and the queue, so the ring held some`);
    assert.ok(b.receiveQueue.messages <= 4, `the reader stopped at its bound (${b.receiveQueue.messages} unread)`);
    const drained = once(a, 'drain');
    for (let i = 0; i < sent; i++) assert.equal(((await b.receive({ timeout: 5000 })) as { i: number }).i, i);
    await drained;
    assert.equal(a.sendQueue.messages, 0);
  } finally {
    a.close();
    b.close();
  }
});

test('a send after the peer closed fails at once, as on the socket', { skip }, async () => {
  const [a, b] = await linkPair({ frameRing: true });
  b.close();
  assert.throws(() => a.send('too late'), code('ERR_LINK_CLOSED'));
  await assert.rejects(a.receive(), code('ERR_LINK_CLOSED'));
  a.close();
});

test('a side with rings off keeps both directions on the socket', async () => {
  for (const [x, y] of [[false, true], [true, false], [false, false]] as const) {
    const fds = addon.socketpair();
    const l1 = makeLink(fds[0], 'one', x);
    const l2 = makeLink(fds[1], 'two', y);
    try {
      l1.send({ hello: 1 });
      assert.deepEqual(await l2.receive(), { hello: 1 });
      l2.send({ back: 2 });
      assert.deepEqual(await l1.receive(), { back: 2 });
      for (const l of [l1, l2]) assert.deepEqual(l[kRingState](), { sending: false, receiving: false });
    } finally {
      l1.close();
      l2.close();
    }
  }
});

test('a Python peer (no ring feature) keeps the socket both ways', { skip: noPython }, async () => {
  const { child, link } = await spawnPython(pythonFixture('link_child.py'));
  try {
    link.send({ op: 'echo', value: { n: 1 } });
    assert.deepEqual(await link.receive({ signal: AbortSignal.timeout(10_000) }), { value: { n: 1 } });
    assert.deepEqual(link[kRingState](), { sending: false, receiving: false });
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('hostile RING and RING_START frames close the link with ERR_FRAME_INVALID and their fds', { skip }, async () => {
  const ringFrame = (capacity: number) => header(7, 0, 8, 2, (v) => v.setUint32(16, capacity, true));
  const cases: Array<[string, boolean, (send: (b: Uint8Array, fds?: number[]) => void) => void]> = [
    ['RING without the feature in our HELLO', false, (send) => send(ringFrame(65536), [addon.eventfdCreate(), addon.eventfdCreate()])],
    ['RING whose doorbell is not an eventfd', true, (send) => send(ringFrame(65536), [addon.memfdCreate('x'), addon.memfdCreate('y')])],
    ['RING with an unsealed memfd', true, (send) => send(ringFrame(4096), [addon.memfdCreate('x', RING_DATA_OFFSET + 4096), addon.eventfdCreate()])],
    ['RING of a bad capacity', true, (send) => send(ringFrame(5000), [addon.memfdCreate('x'), addon.eventfdCreate()])],
    ['RING_START without a RING from the peer', true, (send) => send(header(8, 0, 0, 0))],
  ];
  for (const [what, feature, play] of cases) {
    const { link, raw } = linkWithRawPeer({ frameRing: true });
    const closed = closeReason(link);
    const before = fdCount();
    raw.send(header(1, 0, 8, 0, (v) => v.setUint32(16, feature ? 7 : 3, true)));
    play((bytes, fds) => {
      raw.send(bytes, fds);
      for (const fd of fds ?? []) addon.close(fd);  // the kernel passed dups
    });
    assert.equal((await closed)?.code, 'ERR_FRAME_INVALID', what);
    for (const r of raw.records) for (const fd of r.fds) addon.close(fd);  // our side's offer, if made
    raw.socket.close();
    assert.ok(fdCount() <= before, `${what}: no fd left behind (${fdCount()} > ${before})`);
  }
});
