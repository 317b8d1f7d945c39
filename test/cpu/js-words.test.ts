// JsWords (the JS-side atomics) against the addon's SharedWords: the same results, the same
// errors, the same memory, on every operation; and what happens once either side is closed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { addon } from '../../src/native/addon.js';
import { HostBuffer } from '../../src/host/index.js';
import { JsWords } from '../../src/channel/js-words.js';
import type { NativeSharedWords } from '../../src/native/channel-types.js';

const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

type Outcome = { ok: unknown } | { err: string };
function outcome(f: () => unknown): Outcome {
  try {
    return { ok: f() };
  } catch (e) {
    return { err: `${(e as Error).name}: ${(e as Error).message}` };
  }
}

/** Twin buffers with the same contents: one driven through the addon, one through JsWords. */
function twins(mapBytes: number, fileBytes = 4096) {
  const a = HostBuffer.allocate(fileBytes);
  const b = HostBuffer.allocate(fileBytes);
  const native = new addon.SharedWords(a.fd, mapBytes);
  const js = new JsWords(new addon.SharedWords(b.fd, mapBytes), b.bytes);
  const close = () => { native.close(); js.close(); a.close(); b.close(); };
  return { a, b, native, js, close };
}

test('every operation matches the addon: results, errors and memory (randomised)', () => {
  for (const mapBytes of [4096, 4092, 4090, 64]) {
    const { a, b, native, js, close } = twins(mapBytes);
    let seed = 0x5eed + mapBytes;
    const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
    const pick = <T>(xs: readonly T[]): T => xs[(rand() * xs.length) | 0]!;
    // Small values mostly, so that swaps and masks hit; the edges of every conversion too.
    const init = new Uint8Array(4096);
    for (let i = 0; i < init.length; i++) init[i] = rand() < 0.7 ? 0 : (rand() * 256) | 0;
    a.bytes.set(init);
    b.bytes.set(init);
    const L = mapBytes;
    const goodOff = () => (((rand() * (L / 4)) | 0) * 4);
    const badOffs = [1, 2, 3, -4, -0, L - 4, L - 8, L, L - 2, L + 4, 1.5, NaN, Infinity, 2 ** 32, 2 ** 32 + 8, 2 ** 60, '8'] as unknown as number[];
    const off = () => (rand() < 0.8 ? goodOff() : pick(badOffs));
    const v32 = [0, 1, 2, 5, 0xff, 0x100, 0xffffffff, 2 ** 31, -1, -6, 2 ** 32 + 5, 1.5, -1.5, NaN, Infinity, -Infinity, '5'] as unknown as number[];
    const val32 = () => (rand() < 0.5 ? (rand() * 4) | 0 : pick(v32));
    const v64 = [0, 1, 2, 2 ** 32, 2 ** 53, 2 ** 53 - 1, 2 ** 53 + 2, 2 ** 54, -1, 1.5, NaN, Infinity, 12345, '5'] as unknown as number[];
    const val64 = () => (rand() < 0.5 ? (rand() * 4) | 0 : pick(v64));
    const ops: Array<() => [string, unknown[]]> = [
      () => ['load32', [off()]],
      () => ['store32', [off(), val32()]],
      () => ['cas32', [off(), val32(), val32()]],
      () => ['add32', [off(), val32()]],
      () => ['and32', [off(), val32()]],
      () => ['or32', [off(), val32()]],
      () => ['load64', [off()]],
      () => ['store64', [off(), val64()]],
      () => ['cas64', [off(), val64(), val64()]],
      () => ['add64', [off(), val64()]],
      () => ['claimFirst32', [off(), pick([4, 8, 64, 6, 0, -4, 1.5, 2 ** 24, 2 ** 24 + 4]), pick([1, 2, 4, 8, 0, 1.5, 1000, 2 ** 20 + 1]),
        pick([0, 1, 3, 7, 100, -1, 1.5, 2 ** 40]), pick([0xff, 0xffffffff, 0, 3, -1]), pick([0, 1, 2, 5, 0xffffffff]), pick([0, 9, 0xffffffff])]],
      () => ['spinWait32', [off(), val32(), pick([0, 5])]],
      () => ['spinCas32', [off(), val32(), val32(), pick([0, 5])]],
    ];
    for (let step = 0; step < 30000; step++) {
      const [name, args] = pick(ops)();
      // A word past 2^53 (as a hostile peer would write) now and then, in both.
      if (step % 97 === 0) {
        const o = goodOff() & ~7;
        const big = pick([2n ** 53n + 1n, 2n ** 64n - 1n, 2n ** 63n]);
        if (o + 8 <= L) for (const h of [a, b]) new DataView(h.bytes.buffer).setBigUint64(o, big, true);
      }
      const call = (w: NativeSharedWords) => outcome(() => (w as unknown as Record<string, (...x: unknown[]) => unknown>)[name]!.apply(w, args));
      const want = call(native);
      const got = call(js);
      const what = `${name}(${args.map(String).join(', ')}) at step ${step}, mapping ${mapBytes}`;
      assert.deepEqual(got, want, what);
      assert.equal(Buffer.compare(a.bytes, b.bytes), 0, `the same memory after ${what}`);
    }
    assert.deepEqual(b.bytes, a.bytes, 'the same memory afterwards');
    close();
  }
});

test('the edge cases, spelled out', () => {
  const { a, b, native, js, close } = twins(4096);
  for (const w of [native, js]) {
    assert.equal(w.cas32(0, 0, 5), 0);
    assert.equal(w.cas32(0, 0, 6), 5, 'a failed swap returns the value seen');
    assert.equal(w.add32(0, -6), 5);
    assert.equal(w.load32(0), 0xffffffff, '32-bit add wraps, results are unsigned');
    assert.equal(w.add32(0, 2), 0xffffffff);
    assert.equal(w.load32(0), 1);
    assert.equal(w.cas32(0, 1, -1), 1);
    assert.equal(w.cas32(0, 2 ** 32 - 1, 7), 0xffffffff, 'expected converts as uint32');
    assert.equal(w.and32(0, 0xff), 7);
    assert.equal(w.or32(0, 0x80000000), 7);
    assert.equal(w.load32(0), 0x80000007);
    w.store64(8, 2 ** 53 - 1);
    assert.equal(w.add64(8, 1), 2 ** 53 - 1);
    assert.equal(w.load64(8), 2 ** 53, '2^53 itself reads back');
    assert.equal(w.add64(8, 1), 2 ** 53);
    assert.equal(w.load64(8), -1, 'past 2^53 reads -1');
    assert.equal(w.cas64(8, 0, 1), -1);
    w.store64(16, 2 ** 53);
    assert.equal(w.cas64(16, 2 ** 53, 3), 2 ** 53);
    assert.equal(w.load64(16), 3);
    assert.throws(() => w.store64(24, 2 ** 53 + 2), { name: 'RangeError', message: 'value must be an integer in 0..2^53' });
    assert.throws(() => w.store64(24, -1), { name: 'RangeError', message: 'value must be an integer in 0..2^53' });
    assert.throws(() => w.store64(24, 0.5), RangeError);
    assert.throws(() => w.cas64(24, 0, NaN), { name: 'RangeError', message: 'desired must be an integer in 0..2^53' });
    assert.throws(() => w.add64(24, 2 ** 60), { name: 'RangeError', message: 'delta must be an integer in 0..2^53' });
    for (const o of [1, 2, 3]) assert.throws(() => w.load32(o), { name: 'RangeError', message: 'offset is not aligned to the word size' });
    for (const o of [4, 12, 4084]) assert.throws(() => w.load64(o), { name: 'RangeError', message: 'offset is not aligned to the word size' });
    for (const o of [-4, 4096, 4094, 1.5, NaN, 2 ** 32, 2 ** 60]) assert.throws(() => w.store32(o, 1), { name: 'RangeError', message: 'offset outside the shared words' });
    for (const o of [4089, 4092, -8]) assert.throws(() => w.load64(o), { name: 'RangeError', message: 'offset outside the shared words' });
    assert.throws(() => w.load32('8' as never), TypeError);
    // Slot words at 64 + i*64 (low byte: kind); start at 2, wrap around.
    w.store32(64 + 2 * 64, 0x101);
    assert.equal(w.claimFirst32(64, 64, 4, 2, 0xff, 0, 9), 3);
    assert.equal(w.claimFirst32(64, 64, 4, 2, 0xff, 0, 9), 0, 'wraps to the start');
    assert.equal(w.claimFirst32(64, 64, 4, 6, 0xff, 0, 9), 1, 'start is taken modulo count');
    assert.equal(w.claimFirst32(64, 64, 4, 0, 0xff, 1, 0xffffffff), 2, 'matches under the mask');
    assert.equal(w.load32(64 + 2 * 64), 0xffffffff);
    assert.equal(w.claimFirst32(64, 64, 4, 0, 0xff, 0, 9), -1);
    assert.throws(() => w.claimFirst32(64, 64, 100, 0, 0xff, 0, 9), { name: 'RangeError', message: 'words outside the shared words' });
    assert.throws(() => w.claimFirst32(64, 6, 4, 0, 0xff, 0, 9), { name: 'RangeError', message: 'stride must be a positive multiple of 4' });
    assert.throws(() => w.claimFirst32(64, 8, 0, 0, 0xff, 0, 9), { name: 'RangeError', message: 'count out of range' });
    assert.throws(() => w.claimFirst32(64, 8, 2, -1, 0xff, 0, 9), { name: 'RangeError', message: 'start must be a non-negative integer' });
    assert.equal(w.spinWait32(512, 0, 100), false);
    assert.equal(w.spinWait32(512, 1, 100), true);
    assert.equal(w.spinCas32(512, 1, 2, 50), false);
    assert.equal(w.spinCas32(512, 0, 2, 50), true);
    assert.equal(w.byteLength, 4096);
    assert.equal(typeof w.address, 'bigint');
  }
  assert.deepEqual(b.bytes, a.bytes);
  close();
});

test('JsWords and the addon see the same words of one memfd', () => {
  using hb = HostBuffer.allocate(8192);
  const native = new addon.SharedWords(hb.fd, 8192);
  const js = new JsWords(new addon.SharedWords(hb.fd, 8192), hb.bytes);
  js.store32(100, 7);
  assert.equal(native.load32(100), 7);
  native.store32(100, 9);
  assert.equal(js.load32(100), 9);
  for (let i = 0; i < 1000; i++) { js.add32(4, 1); native.add32(4, 1); }
  assert.equal(js.load32(4), 2000);
  js.store64(8000, 2 ** 53 - 5);
  assert.equal(native.load64(8000), 2 ** 53 - 5);
  native.store64(8000, 2 ** 53);
  native.add64(8000, 2 ** 10);
  assert.equal(js.load64(8000), -1, 'a value past 2^53 written natively reads -1');
  assert.equal(js.claimFirst32(4096, 4, 4, 0, 0xffffffff, 0, 1), 0);
  assert.equal(native.load32(4096), 1);
  assert.equal(js.spinCas32(4096, 1, 0, 0), true);
  assert.equal(native.load32(4096), 0);
  native.close();
  js.close();
});

test('operations throw once closed, or once the HostBuffer under the bytes is closed', () => {
  const every = (w: NativeSharedWords): Array<() => unknown> => [
    () => w.load32(0), () => w.store32(0, 1), () => w.cas32(0, 0, 1), () => w.add32(0, 1), () => w.and32(0, 1), () => w.or32(0, 1),
    () => w.load64(0), () => w.store64(0, 1), () => w.cas64(0, 0, 1), () => w.add64(0, 1), () => w.claimFirst32(0, 4, 2, 0, 0xff, 0, 1),
    () => w.spinWait32(0, 0, 0), () => w.spinCas32(0, 0, 1, 0),
  ];
  {
    using hb = HostBuffer.allocate(4096);
    const js = new JsWords(new addon.SharedWords(hb.fd, 4096), hb.bytes);
    js.store32(0, 3);
    js.close();
    for (const f of every(js)) assert.throws(f, code('EBADF'), String(f));
    assert.equal(js.byteLength, 0);
    js.close();
    assert.throws(() => new JsWords(js.native, hb.bytes), code('EBADF'), 'a closed native object');
    assert.equal(hb.bytes[0], 3, 'the memory is untouched');
  }
  {
    const hb = HostBuffer.allocate(4096);
    const bytes = hb.bytes;
    const js = new JsWords(new addon.SharedWords(hb.fd, 4096), bytes);
    js.store32(0, 3);
    hb.close();
    assert.equal(bytes.length, 0, 'detached');
    for (const f of every(js).filter((_, i) => i !== 11)) assert.throws(f, code('EBADF'), String(f));
    assert.equal(js.native.load32(0), 3, 'the native mapping is its own');
    js.close();
  }
  {
    using hb = HostBuffer.allocate(4096);
    const native = new addon.SharedWords(hb.fd, 4096);
    assert.throws(() => new JsWords(native, hb.bytes.subarray(0, 1024)), RangeError, 'bytes shorter than the mapping');
    assert.throws(() => new JsWords(native, hb.bytes.subarray(4)), RangeError);
    native.close();
  }
});
