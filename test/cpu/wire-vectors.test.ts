// Wire conformance vectors (test/vectors/, made by scripts/gen-wire-vectors.mjs): every recorded
// frame and record decodes to the value recorded beside it, and that value encodes to the same
// bytes, with Node's decoders and encoders. python/tests/test_wire_vectors.py does the same with
// Python's: the two implementations read and write one set of bytes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { CODECS, VECTORS, hex, readVectors } from '../helpers/wire-vectors.js';

const dir = fileURLToPath(new URL('../../../test/vectors', import.meta.url));
const vectors = readVectors(dir);

test('the vectors are there: one per vector the generator makes, every kind of the issue covered', () => {
  assert.deepEqual(vectors.map((v) => v.name).sort(), VECTORS.map((v) => v.name).sort(), 'run node scripts/gen-wire-vectors.mjs after adding or renaming a vector');
  const kinds = new Set(vectors.map((v) => v.kind));
  for (const k of ['frame-hello', 'frame-message', 'frame-large-message', 'frame-release', 'frame-gone', 'descriptor', 'nccl-buffer', 'nccl-tensor-set', 'tensor-set', 'channel-control-block']) {
    assert.ok(kinds.has(k), `no vector of kind ${k}`);
  }
  assert.ok(vectors.every((v) => v.bytes.byteLength >= 16), 'every vector has its bytes');
});

for (const v of vectors) {
  test(`vector ${v.name} (${v.kind}): decodes to its recorded value and encodes back to the same bytes`, () => {
    const codec = CODECS[v.kind];
    assert.ok(codec, `no codec for kind ${v.kind}`);
    assert.deepEqual(codec.decode(v.bytes, v.fds ?? 0), v.value);
    assert.equal(hex(codec.encode(v.value)), hex(v.bytes));
  });
}

test('a vector that lies fails: one byte changed changes the value or is refused', () => {
  const v = vectors.find((x) => x.name === 'release-many')!;
  const bytes = v.bytes.slice();
  bytes[bytes.length - 8] ^= 0x01; // the low byte of the last id
  assert.notDeepEqual(CODECS[v.kind]!.decode(bytes, 0), v.value);
  const bad = v.bytes.slice();
  bad[0] ^= 0xff; // the magic
  assert.throws(() => CODECS[v.kind]!.decode(bad, 0), { code: 'ERR_FRAME_INVALID' });
});
