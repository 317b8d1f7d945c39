// The packed stream of an nccl-tensor-set (PROTOCOL.md 8.3): offsets that keep runs together and
// alignment, the receiver's checks, and each side's chunk routes (direct or through staging).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkPackedLayout, packOffsets, routeChunks, type ChunkRoute, type PlacedTensor } from '../../src/tensors/packed-stream.js';

const A = {};
const B = {};

test('tensors back to back in one allocation form one run; others start at their address mod 256', () => {
  const base = 0x7f00_0000_0000n;
  const { offsets, length } = packOffsets([
    { nbytes: 1000, address: base + 64n, allocation: A },
    { nbytes: 24, address: base + 1064n, allocation: A },        // right after: same run
    { nbytes: 512, address: base + 4096n + 8n, allocation: A },  // a gap in the allocation: new run
    { nbytes: 100, address: 0x10_0000_0000n + 3n * 256n + 2n, allocation: B },
  ]);
  assert.deepEqual(offsets, [64, 1064, 1288, 2050]);  // 1800 is 8 mod 256: the next 2 mod 256 is 2050
  assert.equal(offsets[2]! % 256, 8);
  assert.equal(offsets[3]! % 256, 2);
  assert.equal(length, 2150);
});

test('a tensor right after another but in a different allocation starts a new run', () => {
  const { offsets } = packOffsets([
    { nbytes: 256, address: 0x1000n, allocation: A },
    { nbytes: 256, address: 0x1100n, allocation: B },
  ]);
  assert.deepEqual(offsets, [0, 256]);  // same remainder (0) and no gap needed: still laid out right after
});

test('the receiver refuses overlapping, misaligned or short layouts', () => {
  checkPackedLayout([0, 8, 16], [8, 8, 4], [4, 8, 2], 20);
  assert.throws(() => checkPackedLayout([0, 4], [8, 8], [4, 4], 12), { code: 'ERR_FRAME_INVALID', message: /inside the tensor before it/ });
  assert.throws(() => checkPackedLayout([0, 10], [8, 8], [4, 4], 18), { code: 'ERR_FRAME_INVALID', message: /not a multiple of its 4-byte/ });
  assert.throws(() => checkPackedLayout([0, 8], [8, 8], [4, 4], 32), { code: 'ERR_FRAME_INVALID', message: /last tensor ends at byte 16/ });
});

function placed(offset: number, nbytes: number, address: bigint | undefined): PlacedTensor {
  return { offset, nbytes, address };
}

test('chunks inside one run go direct; a chunk that spans runs or gaps is gathered piece by piece', () => {
  // Run 1: tensors 0..1 at 0x1000 (bytes 0..3000 of the stream), run 2: tensor 2 elsewhere.
  const tensors = [placed(0, 1000, 0x1000n), placed(1000, 2000, 0x1000n + 1000n), placed(3072, 1000, 0x9000n)];
  const routes = routeChunks(tensors, 4072, 1024);
  assert.equal(routes.length, 4);
  assert.deepEqual(routes[0], { direct: true, address: 0x1000n, bytes: 1024 });
  assert.deepEqual(routes[1], { direct: true, address: 0x1000n + 1024n, bytes: 1024 });
  // Bytes 2048..3072: tensor 1 up to 3000, then a gap: not all bytes are a tensor's.
  assert.deepEqual(routes[2], { direct: false, bytes: 1024, copies: [[0, 0x1000n + 2048n, 952]] });
  // Bytes 3072..4072: all of tensor 2, one range of its memory.
  assert.deepEqual(routes[3], { direct: true, address: 0x9000n, bytes: 1000 } satisfies ChunkRoute);
});

test('a chunk ending exactly where its run ends goes direct; tensors without an address are dropped', () => {
  const tensors = [placed(0, 512, 0x2000n), placed(512, 512, 0x2200n), placed(1024, 1024, undefined)];
  const routes = routeChunks(tensors, 2048, 1024);
  assert.deepEqual(routes[0], { direct: true, address: 0x2000n, bytes: 1024 });
  assert.deepEqual(routes[1], { direct: false, bytes: 1024, copies: [] });
});

test('memory of its own (one allocation over the whole stream) makes every chunk direct', () => {
  const base = 0x5000_0000n;
  // The receiver's own allocation covers the gaps between tensors too: one placement over the whole stream.
  const routes = routeChunks([placed(0, 70_010, base)], 70_010, 16_384);
  assert.equal(routes.length, 5);
  assert.ok(routes.every((r) => r.direct));
  assert.equal(routes[4]!.bytes, 70_010 - 4 * 16_384);
});
