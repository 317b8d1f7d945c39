// GONE notices (PROTOCOL.md 3.2): a process tells its peer which allocations it freed, so that the
// peer drops what it caches of them. Here through the public API with an application's own kind
// (the built-in kinds, legacy mappings and imported pools, need a GPU: test/gpu/gone.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { announceGone, registerGoneHandler } from '../../src/link/index.js';
import { FrameType, encodeGone, readGoneEntries } from '../../src/link/transport/frame.js';
import { HELLO, header, linkPair, linkWithRawPeer } from '../fixtures/link-pair.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil } from '../helpers/wait.js';

test('announced allocations reach the handlers of their kind on the peer, batched; unknown kinds are ignored', async () => {
  const [a, b] = await linkPair();
  const seen: Array<[string, number[], boolean]> = [];
  const off1 = registerGoneHandler('app-weights', (key, link) => seen.push(['app-weights', [...key], link === b]));
  const off2 = registerGoneHandler('app-weights', (key) => seen.push(['second', [...key], true]));
  try {
    assert.equal(a.acceptsGone, true);
    for (let i = 0; i < 3; i++) assert.equal(announceGone(a, 'app-weights', new Uint8Array([i, 7])), true);
    assert.equal(announceGone(a, 'nobody-listens', new Uint8Array(4)), true);
    await waitUntil(() => seen.length >= 6, `both handlers to see the three notices (${seen.length} calls)`);
    assert.deepEqual(seen.filter((s) => s[0] === 'app-weights'), [['app-weights', [0, 7], true], ['app-weights', [1, 7], true], ['app-weights', [2, 7], true]]);
    assert.equal(seen.filter((s) => s[0] === 'second').length, 3, 'every handler of the kind runs');
    assert.equal(b.closed, false);
    assert.throws(() => announceGone(a, '', new Uint8Array(1)), argError('ERR_INVALID_ARG_VALUE'));
    assert.throws(() => announceGone(a, 'k', new Uint8Array(1025)), argError('ERR_INVALID_ARG_VALUE'));
    assert.throws(() => announceGone(a, 'k', 'key' as never), argError('ERR_INVALID_ARG_TYPE'));
  } finally {
    off1();
    off2();
    a.close();
    b.close();
  }
  assert.equal(announceGone(a, 'app-weights', new Uint8Array(1)), false, 'a closed link takes no notice');
});

test('a peer whose HELLO lacks feature bit 1 gets no GONE frame', async () => {
  const { link, raw } = linkWithRawPeer();
  try {
    raw.send(HELLO(1));  // large messages, no notices
    await waitUntil(() => link.state === 'open', "the link to take the raw peer's HELLO");
    assert.equal(link.acceptsGone, false);
    assert.equal(announceGone(link, 'app', new Uint8Array(3)), false);
    // A message sent after the notice would have been arriving is the later event.
    link.send('after');
    await waitUntil(() => raw.records.some((r) => r.bytes[5] === FrameType.Message), 'the message sent after the notice to arrive');
    assert.equal(raw.records.filter((r) => r.bytes[5] === FrameType.Gone).length, 0);
  } finally {
    link.close();
    raw.socket.close();
  }
});

test('GONE frames round-trip, split past a frame, and malformed ones close the link with ERR_FRAME_INVALID', async () => {
  const entries = Array.from({ length: 3000 }, (_, i) => ({ kind: 'legacy-buffer', key: new Uint8Array(64).fill(i & 255) }));
  const frames = encodeGone(entries);
  assert.ok(frames.length > 1 && frames.every((f) => f.byteLength <= 128 * 1024));
  const back = frames.flatMap((f) => readGoneEntries(f, new DataView(f.buffer), f.byteLength - 16));
  assert.deepEqual(back.map((e) => e.key[0]), entries.map((e) => e.key[0]));

  const bad: Array<[string, Uint8Array]> = [
    ['no entries', header(6, 0, 8, 0)],
    ['a count past the entries', header(6, 0, 8 + 5, 0, (v) => { v.setUint32(16, 2, true); v.setUint8(24, 1); v.setUint8(25, 0x41); v.setUint16(26, 0, true); })],
    ['a kind that is not printable', header(6, 0, 8 + 4, 0, (v) => { v.setUint32(16, 1, true); v.setUint8(24, 1); v.setUint8(25, 0x0a); v.setUint16(26, 0, true); })],
    ['a key past the end', header(6, 0, 8 + 4, 0, (v) => { v.setUint32(16, 1, true); v.setUint8(24, 1); v.setUint8(25, 0x41); v.setUint16(26, 9, true); })],
    ['stray bytes', header(6, 0, 8 + 5, 0, (v) => { v.setUint32(16, 1, true); v.setUint8(24, 1); v.setUint8(25, 0x41); v.setUint16(26, 0, true); })],
    ['flags', header(6, 1, 8 + 4, 0, (v) => { v.setUint32(16, 1, true); v.setUint8(24, 1); v.setUint8(25, 0x41); })],
  ];
  for (const [what, frame] of bad) {
    const { link, raw } = linkWithRawPeer();
    try {
      raw.send(HELLO(3));
      raw.send(frame);
      await assert.rejects(link.receive({ timeout: 2000 }), (e: unknown) => e instanceof IpcError && e.code === 'ERR_FRAME_INVALID' && link.closed, what);
    } finally {
      link.close();
      raw.socket.close();
    }
  }
});
