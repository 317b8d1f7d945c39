// The ring's corruption checks at their exact bounds (issue 41): a value read from the shared
// control block one past what is valid is ERR_CHANNEL_CORRUPT, the last valid one is accepted.
// Broadcast (peekAt) and work sharing (take), at the ring's level and through a channel's
// consumer, and the bounds of a slot record (length, meta) that a consumer hands out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { addon } from '../../src/native/addon.js';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { ChannelHub } from '../../src/channel/index.js';
import { Ring } from '../../src/channel/slot-ring.js';
import { computeLayout, writeHeader, H, P, S, PRole, PState, Kind } from '../../src/channel/layout.js';
import { controlBytesOf } from '../helpers/channel-internals.js';

const SLOTS = 4;

/** An IpcError ERR_CHANNEL_CORRUPT whose message names `what` (never a RangeError or a crash). */
const corrupt = (what: RegExp) => (e: unknown) => {
  assert.ok(e instanceof IpcError, `an IpcError, not ${String(e)}`);
  assert.equal(e.code, 'ERR_CHANNEL_CORRUPT');
  assert.match(e.message, what);
  return true;
};

/** A control block with the hub, one producer and one consumer simulated in this process. */
function block(broadcast: boolean) {
  const l = computeLayout({ slotCount: SLOTS, slotBytes: 64, metaBytes: 0, maxParticipants: 8, device: false, broadcast });
  const hb = HostBuffer.allocate(l.totalBytes);
  writeHeader(new DataView(hb.bytes.buffer), l, 1, 1);
  const words = new addon.SharedWords(hb.fd, l.totalBytes);
  const layout = { ...l, expectProducers: 1, expectConsumers: 1 };
  const bells = { ring() {} };
  const hub = new Ring(words, hb.bytes, layout, bells);
  hub.w.store32(hub.partOff(0) + P.role, PRole.Hub);
  hub.w.store32(hub.partOff(0) + P.state, PState.Alive);
  const join = (role: number) => {
    const k = hub.allocateParticipant(role, process.pid);
    assert.ok(hub.activate(k, role));
    return k;
  };
  const producer = new Ring(words, hb.bytes, layout, bells, join(PRole.Producer));
  const consumerIndex = join(PRole.Consumer);
  // A fresh view of the consumer each time: a Ring remembers the tail it read last.
  const consumer = () => new Ring(words, hb.bytes, layout, bells, consumerIndex);
  const publish = () => {
    const s = producer.claimSlot();
    assert.ok(s >= 0, 'a free slot');
    assert.equal(producer.publish(s), 'ok');
    return s;
  };
  const close = () => { words.close(); hb.close(); };
  return { hub, consumer, publish, close };
}

test('broadcast: a ring entry naming a slot past the ring is ERR_CHANNEL_CORRUPT; the last slot is not', () => {
  const { hub, consumer, publish, close } = block(true);
  const s = publish();
  assert.equal(consumer().peekAt(0), s, 'the message published at position 0');
  for (const bad of [SLOTS, SLOTS + 1, 0xffff_ffff]) {
    hub.w.store32(hub.ringOff(0), bad);
    assert.throws(() => consumer().peekAt(0), corrupt(new RegExp(`ring entry names slot ${bad} of ${SLOTS}`)), `slot ${bad}`);
  }
  // The last slot of the ring is a valid index: it holds no message at position 0, so it is
  // skipped (-2), not refused.
  const last = s === SLOTS - 1 ? 0 : SLOTS - 1;
  hub.w.store32(hub.ringOff(0), last);
  assert.equal(consumer().peekAt(0), -2);
  hub.w.store32(hub.ringOff(0), s);
  assert.equal(consumer().peekAt(0), s, 'the entry put back is delivered again');
  close();
});

test('broadcast: more messages ahead of a consumer than the ring holds is ERR_CHANNEL_CORRUPT; exactly a ringful is not', () => {
  const { hub, consumer, publish, close } = block(true);
  const s = publish();
  assert.equal(consumer().peekAt(1), -1, 'nothing at position 1 yet');
  hub.w.store64(H.tail, SLOTS);  // positions 0..SLOTS-1 ahead of cursor 0: a full ring
  assert.equal(consumer().peekAt(0), s);
  hub.w.store64(H.tail, SLOTS + 1);
  assert.throws(() => consumer().peekAt(0), corrupt(new RegExp(`${SLOTS + 1} messages ahead of a consumer in a ring of ${SLOTS} slots`)));
  assert.equal(consumer().peekAt(SLOTS + 1), -1, 'a cursor at the tail sees nothing, whatever lies behind it');
  // Counted from the cursor, not from 0: a ringful ahead of cursor 2 is fine, one more is not.
  hub.w.store64(H.tail, 2 + SLOTS);
  assert.equal(consumer().peekAt(2), -2, 'position 2 was never published: skipped, not refused');
  hub.w.store64(H.tail, 3 + SLOTS);
  assert.throws(() => consumer().peekAt(2), corrupt(new RegExp(`\\(${SLOTS + 1} messages ahead of a consumer in a ring of ${SLOTS} slots\\)`)));
  close();
});

test('broadcast: a ring entry naming a slot published at another position is skipped, not delivered', () => {
  const { hub, consumer, publish, close } = block(true);
  const a = publish(), b = publish();
  assert.equal(consumer().peekAt(0), a);
  assert.equal(consumer().peekAt(1), b);
  hub.w.store32(hub.ringOff(0), b);  // b is held for this consumer, but at position 1
  assert.equal(consumer().peekAt(0), -2);
  hub.w.store32(hub.ringOff(0), a);
  hub.w.store32(hub.slotOff(a) + S.holders, 0);  // at position 0, but not held for it
  assert.equal(consumer().peekAt(0), -2);
  close();
});

test('broadcast and work sharing: a tail or head past 2^53 is ERR_CHANNEL_CORRUPT', () => {
  for (const broadcast of [true, false]) {
    const { hub, consumer, close } = block(broadcast);
    assert.equal(broadcast ? consumer().peekAt(0) : consumer().take(), -1, 'an empty ring: nothing, no error');
    hub.w.store64(H.tail, 1);
    const ring = new DataView(hub.bytes.buffer, hub.bytes.byteOffset, hub.bytes.byteLength);
    ring.setBigUint64(H.tail, 1n << 60n, true);
    assert.throws(() => (broadcast ? consumer().peekAt(0) : consumer().take()), corrupt(/tail out of range/));
    if (!broadcast) {
      ring.setBigUint64(H.tail, 1n, true);
      ring.setBigUint64(H.head, 1n << 60n, true);
      assert.throws(() => consumer().take(), corrupt(/head out of range/));
    }
    close();
  }
});

test('work sharing: a ring entry naming a slot past the ring, or more than a ringful published, is ERR_CHANNEL_CORRUPT', () => {
  const { hub, consumer, publish, close } = block(false);
  const s = publish();
  for (const bad of [SLOTS, 0xffff_ffff]) {
    hub.w.store32(hub.ringOff(0), bad);
    assert.throws(() => consumer().take(), corrupt(new RegExp(`ring entry names slot ${bad} of ${SLOTS}`)), `slot ${bad}`);
  }
  hub.w.store32(hub.ringOff(0), s);
  hub.w.store64(H.tail, SLOTS + 1);
  assert.throws(() => consumer().take(), corrupt(new RegExp(`${SLOTS + 1} messages in a ring of ${SLOTS} slots`)));
  // Counted from head: with head at 1, tail 2 + SLOTS is one past a ringful.
  hub.w.store64(H.head, 1);
  hub.w.store64(H.tail, 2 + SLOTS);
  assert.throws(() => consumer().take(), corrupt(new RegExp(`\\(${SLOTS + 1} messages in a ring of ${SLOTS} slots\\)`)));
  hub.w.store64(H.head, 0);
  // A ringful is not corrupt: the message at position 0 is taken, the others (never published)
  // are passed over.
  hub.w.store64(H.tail, SLOTS);
  assert.equal(consumer().take(), s);
  close();
});

/** A channel hub and one consumer, its control block written by hand (no producer). */
function channel(topology: 'queue' | 'broadcast') {
  const hub = ChannelHub.create({ slots: SLOTS, slotBytes: 64, metaBytes: 64, topology });
  const ch = hub.consumer();
  const bytes = controlBytesOf(ch);
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const l = computeLayout({ slotCount: SLOTS, slotBytes: 64, metaBytes: 64, maxParticipants: 16, device: false, broadcast: topology === 'broadcast' });
  return { hub, ch, v, l };
}

test('a broadcast consumer refuses a ring entry past the ring with ERR_CHANNEL_CORRUPT (not a RangeError)', () => {
  for (const bad of [SLOTS, 999, 0xffff_ffff]) {
    const { hub, ch, v, l } = channel('broadcast');
    assert.equal(ch.tryReceive(), undefined, 'nothing published yet');
    v.setUint32(l.ringOffset, bad, true);
    v.setBigUint64(H.tail, 1n, true);
    assert.throws(() => ch.tryReceive(), corrupt(new RegExp(`ring entry names slot ${bad} of ${SLOTS}`)), `slot ${bad}`);
    hub.close();
  }
});

test('a message\'s length and meta at their bounds are handed out; one past them is ERR_CHANNEL_CORRUPT', () => {
  // A message in slot 1 at position 0 from a made-up producer 1, its fields set by `fill`.
  const deliver = (fill: (v: DataView, so: number) => void) => {
    const { hub, ch, v, l } = channel('queue');
    const so = l.slotRecordsOffset + 1 * l.slotRecordBytes;
    v.setUint32(so + S.state, Kind.Published | (1 << 8), true);
    v.setBigUint64(so + S.position, 0n, true);
    fill(v, so);
    v.setUint32(l.ringOffset, 1, true);
    v.setBigUint64(H.tail, 1n, true);
    try {
      const m = ch.tryReceive();
      assert.ok(m, 'a message');
      const got = { length: m.length, meta: m.meta };
      m.release();
      return got;
    } finally {
      hub.close();
    }
  };
  assert.equal(deliver((v, so) => v.setBigUint64(so + S.length, 64n, true)).length, 64, 'a full slot');
  assert.throws(() => deliver((v, so) => v.setBigUint64(so + S.length, 65n, true)), corrupt(/length 65, meta 0 bytes of kind 0/));
  assert.throws(() => deliver((v, so) => v.setBigUint64(so + S.length, 1n << 32n, true)), corrupt(/length 4294967296/), 'the high word counts');
  const json = (v: DataView, so: number, text: string) => {
    v.setUint32(so + S.metaKind, 1, true);
    v.setUint32(so + S.metaLength, text.length, true);
    for (let i = 0; i < text.length; i++) v.setUint8(so + S.meta + i, text.charCodeAt(i));
  };
  const full = `"${'x'.repeat(62)}"`;
  assert.equal(deliver((v, so) => json(v, so, full)).meta, 'x'.repeat(62), '64 bytes of JSON meta: the whole area');
  assert.throws(() => deliver((v, so) => { json(v, so, '1'); v.setUint32(so + S.metaLength, 65, true); }), corrupt(/meta 65 bytes of kind 1/));
  assert.deepEqual(deliver((v, so) => { v.setUint32(so + S.metaKind, 2, true); v.setUint32(so + S.metaLength, 2, true); v.setUint8(so + S.meta, 7); }).meta, new Uint8Array([7, 0]), 'bytes meta');
  assert.throws(() => deliver((v, so) => v.setUint32(so + S.metaKind, 3, true)), corrupt(/of kind 3/));
  assert.throws(() => deliver((v, so) => json(v, so, '{"a"')), corrupt(/its meta is not JSON/));
});
