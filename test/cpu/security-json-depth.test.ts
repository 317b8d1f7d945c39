// Issue 40.3: JSON nested deeper than MAX_JSON_DEPTH (512, as on the Python side) closes the link
// with ERR_FRAME_INVALID, on a Unix-socket link (the 2 MB text travels in a sealed memfd) and on a
// TCP link (inline); 512 levels and brackets inside strings still decode. The deep texts are built
// as strings: nothing here parses or stringifies them recursively.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { MAX_JSON_DEPTH, nestsTooDeep } from '../../src/link/messages/message-decoder.js';
import { HELLO, header, linkWithRawPeer } from '../fixtures/link-pair.js';
import { memfdWith } from '../fixtures/odd-fds.js';
import { addon } from '../../src/native/addon.js';
import { jsonFrame, tcpHello, tcpLinkWithRawPeer } from '../fixtures/tcp-peer.js';

const deep = (n: number): string => '['.repeat(n) + ']'.repeat(n);
const MILLION = 1_000_000;

/** A JSON message too large for a frame: its header, and the sealed memfd with the text. */
function largeJson(text: string): { bytes: Uint8Array; fd: number } {
  const body = Buffer.from(text);
  return { bytes: header(2, 0x100, 8, 1, (v) => v.setBigUint64(16, BigInt(body.byteLength), true)), fd: memfdWith(body) };
}

test('the depth scan: brackets in strings and escaped quotes do not count; 512 passes, 513 does not', () => {
  const b = (s: string) => Buffer.from(s);
  assert.equal(nestsTooDeep(b(deep(MAX_JSON_DEPTH)), 0, 2 * MAX_JSON_DEPTH), false);
  assert.equal(nestsTooDeep(b(deep(MAX_JSON_DEPTH + 1)), 0, 2 * MAX_JSON_DEPTH + 2), true);
  const inString = `["${'['.repeat(5000)}\\"[[", {"k": "{{{"}]`;
  assert.equal(nestsTooDeep(b(inString), 0, inString.length), false);
});

test('a Unix-socket link closes with ERR_FRAME_INVALID on JSON nested 1,000,000 deep (and on 513); 512 levels decode', { timeout: 60_000 }, async () => {
  for (const depth of [MILLION, MAX_JSON_DEPTH + 1]) {
    const { link, raw } = linkWithRawPeer();
    try {
      raw.send(HELLO(3));
      if (depth === MILLION) {
        const m = largeJson(deep(depth));
        try {
          raw.send(m.bytes, [m.fd]);
        } finally {
          addon.close(m.fd);
        }
      } else {
        raw.send(jsonFrame(deep(depth)));
      }
      await assert.rejects(link.receive({ timeout: 20_000 }), (e: unknown) => {
        assert.ok(e instanceof IpcError);
        assert.equal(e.code, 'ERR_FRAME_INVALID');
        assert.match(e.message, /nests deeper than 512 levels/);
        return true;
      });
      assert.equal(link.closed, true);
    } finally {
      link.close();
      raw.socket.close();
    }
  }
  const { link, raw } = linkWithRawPeer();
  try {
    raw.send(HELLO(3));
    raw.send(jsonFrame(deep(MAX_JSON_DEPTH)));
    let v = (await link.receive({ timeout: 10_000 })) as unknown[];
    for (let i = 1; i < MAX_JSON_DEPTH; i++) v = v[0] as unknown[];
    assert.deepEqual(v, []);
  } finally {
    link.close();
    raw.socket.close();
  }
});

test('a TCP link closes with ERR_FRAME_INVALID on JSON nested 1,000,000 deep, sent inline', { timeout: 60_000 }, async () => {
  const { listener, raw, link: linkP } = await tcpLinkWithRawPeer();
  try {
    raw.send(tcpHello());
    const link = await linkP;
    raw.send(jsonFrame(deep(MILLION)));
    await assert.rejects(link.receive({ timeout: 20_000 }), (e: unknown) => e instanceof IpcError && e.code === 'ERR_FRAME_INVALID' && /deeper than 512/.test(e.message));
    assert.equal(link.closed, true);
    await raw.closed();
  } finally {
    raw.destroy();
    await listener.close();
  }
});
