// The message decoder (link/messages/message-decoder.ts) on payloads built byte by byte: every
// malformed field is refused with ERR_FRAME_INVALID naming what was wrong, fds and leases of a
// failed message are given back, decoded values land where their records point, and nothing is
// read outside the payload [start, end) of the buffer it sits in (a link's receive buffer holds
// other bytes around it). Issue 41: these are the checks the mutation run showed untested.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import '../../src/link/index.js'; // registers the built-in transfer handlers
import { decodeMessage, disposeValues, leaseIdsOf, MAX_JSON_DEPTH, type Decoded } from '../../src/link/messages/message-decoder.js';
import { DeferredValue } from '../../src/link/messages/handlers.js';
import { DATA_VIEW_TAG, TYPED_ARRAYS } from '../../src/link/messages/message-format.js';
import { IncomingLeases, type ReceivedLease } from '../../src/link/lifetimes/lease.js';
import { registerTransferHandler } from '../../src/link/transfers/transfer.js';
import type { Link } from '../../src/link/connection/link.js';
import { addon } from '../../src/native/addon.js';
import { fdIsOpen } from '../fixtures/fd-count.js';

type Seg = string | number;
interface Rec {
  kind: string;
  path?: Seg[];
  fds?: number;
  lease?: number;
  /** The lease id's high word, when it must be set directly (ids past 2^53). */
  leaseHigh?: number;
  data?: Uint8Array | string;
}

/** Bytes of a JsonWithRecords payload, and for every byte the reason a payload cut there is refused with. */
function build(json: string, recs: Rec[], count = recs.length): { bytes: Buffer; cutReason: string[] } {
  const out: number[] = [];
  const cutReason: string[] = [];
  const put = (reason: string, ...bytes: number[]): void => {
    for (const b of bytes) {
      out.push(b);
      cutReason.push(reason);
    }
  };
  const u16 = (n: number): number[] => [n & 0xff, n >>> 8];
  const u32 = (n: number): number[] => [n & 0xff, (n >>> 8) & 0xff, (n >>> 16) & 0xff, n >>> 24];
  const jsonBytes = [...Buffer.from(json)];
  put('truncated JSON length', ...u32(jsonBytes.length));
  put('JSON length past the end', ...jsonBytes);
  put('truncated record count', ...u16(count));
  for (const r of recs) {
    const kind = [...Buffer.from(r.kind, 'latin1')];
    put('truncated record', kind.length);
    put('bad record kind', ...kind);
    put('bad record kind', (r.path ?? []).length);
    for (const s of r.path ?? []) {
      if (typeof s === 'number') {
        put('truncated path', 0);
        put('truncated path index', ...u32(s));
      } else {
        const key = [...Buffer.from(s)];
        put('truncated path', 1);
        put('truncated path key', ...u16(key.length));
        put('path key past the end', ...key);
      }
    }
    const data = typeof r.data === 'string' ? [...Buffer.from(r.data, 'latin1')] : [...(r.data ?? [])];
    const lease = r.lease ?? 0;
    put('truncated record data', r.fds ?? 0, ...u32(lease % 0x1_0000_0000), ...u32(r.leaseHigh ?? Math.floor(lease / 0x1_0000_0000)), ...u32(data.length));
    put('record data past the end', ...data);
  }
  return { bytes: Buffer.from(out), cutReason };
}

/** `payload` inside a larger buffer, with `before` and `after` bytes around it, as in a link's receive buffer. */
function framed(payload: Uint8Array, before = 16, fill = 0x01): { buf: Buffer; start: number; end: number } {
  const ab = new ArrayBuffer(before + payload.byteLength + 64);
  const buf = Buffer.from(ab, 0, ab.byteLength);
  buf.fill(fill);
  buf.set(payload, before);
  return { buf, start: before, end: before + payload.byteLength };
}

const link = {} as unknown as Link;

function decode(encoding: 0 | 1 | 2, payload: Uint8Array, fds?: number[], leases?: IncomingLeases, transport: 'unix' | 'tcp' = 'unix', fill = 0x01): Decoded {
  const { buf, start, end } = framed(payload, 16, fill);
  return decodeMessage(encoding, buf, start, end, fds, link, leases, undefined, transport);
}

function records(json: string, recs: Rec[], fds?: number[], leases?: IncomingLeases, transport: 'unix' | 'tcp' = 'unix'): Decoded {
  return decode(2, build(json, recs).bytes, fds, leases, transport);
}

/** The message failed as malformed (fatal, ERR_FRAME_INVALID), saying `why`. */
function assertMalformed(d: Decoded, why: string | RegExp): void {
  assert.ok(!d.ok, `expected a malformed payload (${String(why)}), got a value`);
  assert.equal(d.error.code, 'ERR_FRAME_INVALID');
  assert.equal(d.fatal, true);
  if (typeof why === 'string') assert.equal(d.error.message, `received a malformed message payload: ${why}`);
  else assert.match(d.error.message, why);
}

function value(d: Decoded): unknown {
  if (!d.ok) assert.fail(`expected a value, got ${d.error.code}: ${d.error.message}`);
  return d.value;
}

// Test transfer handlers (kinds registered once for the file).
class Box {
  disposed = 0;
  constructor(
    readonly text: string,
    readonly fds: number[],
    readonly link: object,
    readonly lease: ReceivedLease | undefined,
  ) {}
  [Symbol.dispose](): void {
    this.disposed++;
  }
}
class Closer {
  closed = 0;
  constructor() {
    closers.push(this);
  }
  close(): void {
    this.closed++;
  }
}
const closers: Closer[] = [];
const decoded: Box[] = [];
const deferred: Array<Promise<void>> = [];
function box(data: Uint8Array, fds: number[], l: object, lease: ReceivedLease | undefined): Box {
  const b = new Box(Buffer.from(data).toString('latin1'), [...fds], l, lease);
  decoded.push(b);
  return b;
}
const never = (): never => assert.fail('not sent');
for (const [kind, transports, decodeFn] of [
  ['test-dec-box', ['unix', 'tcp'], box],
  ['test-dec-unix', undefined, box],
  ['test-dec-tcp', ['tcp'], box],
  ['test-dec-number', undefined, (data: Uint8Array) => data.byteLength],
  ['test-dec-null', undefined, () => null],
  ['test-dec-closer', undefined, () => new Closer()],
  ['test-dec-dispose-throws', undefined, () => ({ [Symbol.dispose]: () => assert.fail('disposal failing is ignored') })],
  ['test-dec-defer', undefined, (data: Uint8Array, fds: number[], l: object, lease: ReceivedLease | undefined) => new DeferredValue(box(data, fds, l, lease), deferred.shift()!)],
  [
    'test-dec-fail',
    undefined,
    (data: Uint8Array, fds: number[]) => {
      const mode = Buffer.from(data).toString('latin1');
      if (mode === 'take-first' || mode === 'take-second') {
        // Takes one fd (now the handler's to close), then fails.
        fds[mode === 'take-first' ? 0 : 1] = -1;
        throw new Error('failed after taking one fd');
      }
      if (mode === 'ipc') throw new IpcError('ERR_HANDLE_STALE', 'the handler\'s own typed error');
      if (mode === 'fatal') throw Object.assign(new Error('out of spec'), { fatal: true });
      if (mode === 'undefined') throw undefined;
      if (mode === 'string') throw 'a thrown string';
      throw new Error('boom');
    },
  ],
] as const) {
  registerTransferHandler({
    kind,
    ...(transports ? { transports: [...transports] } : {}),
    canTransfer: (_v: unknown): _v is object => false,
    encode: never,
    decode: decodeFn as (data: Uint8Array, fds: number[], l: object, lease: ReceivedLease | undefined) => object,
  });
}

function memfds(n: number): number[] {
  return Array.from({ length: n }, () => addon.memfdCreate('decoder-test'));
}
function closeAll(fds: number[]): void {
  for (const fd of fds) if (fd >= 0 && fdIsOpen(fd)) addon.close(fd);
}

test('raw and JSON payloads: exact bytes and values from [start, end) of a larger buffer', () => {
  const raw = decode(1, Buffer.from([9, 8, 7]));
  const bytes = value(raw) as Uint8Array;
  assert.equal(Object.getPrototypeOf(bytes), Uint8Array.prototype);
  assert.deepEqual([...bytes], [9, 8, 7]);
  assert.equal(bytes.byteOffset, 0);
  assert.equal(bytes.buffer.byteLength, 3, 'its own buffer, not a view of the receive buffer');
  assert.equal((value(decode(1, Buffer.alloc(0))) as Uint8Array).byteLength, 0);
  assert.equal(raw.ok && raw.owned, undefined);

  assert.equal(value(decode(0, Buffer.alloc(0))), undefined, 'an empty JSON payload is undefined');
  assert.equal(value(decode(0, Buffer.from('null'))), null);
  for (const text of ['true', '1234', '"ab"', '[{}]', ' 12 ']) assert.deepEqual(value(decode(0, Buffer.from(text))), JSON.parse(text));
  // Four bytes that only look like null, and null followed by more.
  for (const text of ['nul1', 'nulL', 'nuLl', 'nUll', 'Null', 'null1']) assertMalformed(decode(0, Buffer.from(text)), 'the JSON does not parse');
  // Only the payload's bytes are read: what precedes it in the buffer ("llu") cannot complete a null.
  for (const text of ['nAll', 'nuAl', 'nulA']) {
    const payload = Buffer.from(`llu${text}`);
    const buf = Buffer.concat([Buffer.alloc(8, 0x01), payload, Buffer.alloc(8, 0x01)]);
    assertMalformed(decodeMessage(0, buf, 11, 15, undefined, link, undefined), 'the JSON does not parse');
  }
  // Short and long text, ASCII and not (UTF-8 decoded, not byte by byte).
  assert.equal(value(decode(0, Buffer.from('"é€"'))), 'é€');
  assert.equal(value(decode(0, Buffer.from('"\x7f"'))), '\x7f');
  const long = { text: 'x'.repeat(40), nested: { é: ['€', 1, null] } };
  assert.deepEqual(value(decode(0, Buffer.from(JSON.stringify(long)))), long);
  assertMalformed(decode(0, Buffer.from('{"a": 1')), 'the JSON does not parse');
  assertMalformed(decode(0, Buffer.from(`{"a": "${'y'.repeat(40)}"`)), 'the JSON does not parse');
});

test(`JSON nested past ${MAX_JSON_DEPTH} levels is refused; brackets in strings and closed levels do not count`, () => {
  const deep = (n: number, open: string, close: string, inner = '1'): string => open.repeat(n) + inner + close.repeat(n);
  const objects = (n: number, inner = '1'): string => '{"a":'.repeat(n) + inner + '}'.repeat(n);
  const tooDeep = `the JSON nests deeper than ${MAX_JSON_DEPTH} levels`;
  for (const make of [(n: number) => deep(n, '[', ']'), (n: number) => objects(n)]) {
    assert.ok(value(decode(0, Buffer.from(make(MAX_JSON_DEPTH)))) !== undefined);
    assertMalformed(decode(0, Buffer.from(make(MAX_JSON_DEPTH + 1))), tooDeep);
    // The same in the JSON of a message with records.
    assertMalformed(decode(2, build(`[${make(MAX_JSON_DEPTH)},null]`, [{ kind: '@bigint', path: [1], data: '1' }]).bytes), tooDeep);
  }
  // At the bound, with brackets (and an escaped quote before one) inside strings.
  const inStrings = deep(MAX_JSON_DEPTH, '[', ']', '"[[{\\"[{", "\\\\", "{"');
  assert.equal(JSON.stringify(value(decode(0, Buffer.from(inStrings)))).length > 2 * MAX_JSON_DEPTH, true);
  // Levels that closed do not count: two siblings of 300 levels each, arrays and objects.
  const siblings = `[${deep(300, '[', ']')},${objects(300)}]`;
  assert.ok(Array.isArray(value(decode(0, Buffer.from(siblings)))));
  const sibling = `{"x":${objects(300)},"y":${deep(300, '[', ']')}}`;
  assert.ok(typeof value(decode(0, Buffer.from(sibling))) === 'object');
  // At the bound and cut short, with '[' after the payload in the buffer: not counted (the JSON
  // does not parse, and that is the reason given).
  assertMalformed(decode(0, Buffer.from('['.repeat(MAX_JSON_DEPTH) + ' '.repeat(600)), undefined, undefined, 'unix', 0x5b), 'the JSON does not parse');
  // Unparsable and past the bound: refused either way.
  assert.equal(decode(0, Buffer.from('['.repeat(2000))).ok, false);
});

test('every cut of a payload with records is refused, naming the field it cuts, and reads nothing past end', () => {
  const { bytes, cutReason } = build('{"a":null,"b":[1,null],"c":{"k":null}}', [
    { kind: '@bigint', path: ['a'], data: '-1234' },
    { kind: '@typed-array', path: ['b', 1], data: new Uint8Array([1, 5, 6, 7]) },
    { kind: '@bigint', path: ['c', 'k'], data: '9' },
  ]);
  assert.deepEqual(value(decode(2, bytes)), { a: -1234n, b: [1, new Uint8Array([5, 6, 7])], c: { k: 9n } });
  // The bytes after `end` are those of the whole payload again: a read past the cut finds plausible fields.
  for (let cut = 0; cut < bytes.byteLength; cut++) {
    const ab = Buffer.alloc(16 + 2 * bytes.byteLength, 0x01);
    ab.set(bytes.subarray(0, cut), 16);
    ab.set(bytes.subarray(cut), 16 + cut);
    const d = decodeMessage(2, ab, 16, 16 + cut, undefined, link, undefined);
    assertMalformed(d, cutReason[cut]!);
  }
  assertMalformed(decode(2, Buffer.concat([bytes, Buffer.from([0, 0, 0])])), '3 stray bytes after the records');
  assertMalformed(decode(2, Buffer.concat([bytes, Buffer.from([0])])), '1 stray bytes after the records');
});

test('record headers out of spec: no records, an empty kind, an unknown path tag, a lease id past 2^53', () => {
  assertMalformed(decode(2, build('null', [], 0).bytes), 'no records in a message that announces records');
  const emptyKind = build('null', [{ kind: '' }]).bytes;
  assertMalformed(decode(2, emptyKind), 'bad record kind');
  // Path tag 2: take a record with an index segment (tag 0) and change its tag.
  const tagged = build('[null]', [{ kind: '@bigint', path: [0], data: '1' }]);
  const tagAt = tagged.cutReason.indexOf('truncated path');
  tagged.bytes[tagAt] = 2;
  assertMalformed(decode(2, tagged.bytes), 'unknown path segment tag 2');
  // Lease ids: 2^53 - 1 is the largest (then refused for another reason: a leased bigint), 2^53 is out.
  assertMalformed(decode(2, build('null', [{ kind: '@bigint', lease: 2 ** 53 - 1, data: '1' }]).bytes), "a leased '@bigint' record");
  assertMalformed(decode(2, build('null', [{ kind: '@bigint', leaseHigh: 0x20_0000, data: '1' }]).bytes), 'a lease id above 2^53');
  // A record count that claims one more record than there is.
  assertMalformed(decode(2, build('[null]', [{ kind: '@bigint', path: [0], data: '1' }], 2).bytes), 'truncated record');
});

test('built-in records: bigints and typed arrays in range round-trip; anything else is fatal', () => {
  const bigint = (text: string, fds?: number[]): Decoded => records('null', [{ kind: '@bigint', data: text, ...(fds ? { fds: fds.length } : {}) }], fds);
  const digits = '123456789'.repeat(1200).slice(0, 10_000);
  for (const [text, v] of [['0', 0n], ['7', 7n], ['-7', -7n], ['18446744073709551617', 18446744073709551617n], [digits, BigInt(digits)]] as const) {
    const d = bigint(text);
    assert.equal(value(d), v);
    assert.equal(d.ok && d.owned, undefined, 'a bigint owns nothing');
  }
  for (const text of ['', '-', '+1', '1.5', 'a12', '12a', ' 1', '1 ', '--1', '0x1', `${digits}1`]) assertMalformed(bigint(text), /^received a malformed bigint record$/);
  const fds = memfds(1);
  assertMalformed(bigint('1', fds), /^received a malformed bigint record$/);
  assert.equal(fdIsOpen(fds[0]!), false, 'the fd that came with the bad record was closed');

  const typed = (bytes: number[], fds?: number[]): Decoded => records('null', [{ kind: '@typed-array', data: new Uint8Array(bytes), ...(fds ? { fds: fds.length } : {}) }], fds);
  for (let tag = 1; tag < TYPED_ARRAYS.length; tag++) {
    const Ctor = TYPED_ARRAYS[tag]!;
    const data = Array.from({ length: 2 * Ctor.BYTES_PER_ELEMENT }, (_, i) => i + 1);
    const v = value(typed([tag, ...data])) as ArrayBufferView;
    assert.equal(Object.getPrototypeOf(v), Ctor.prototype, Ctor.name);
    assert.deepEqual([...new Uint8Array(v.buffer)], data);
    assert.equal(v.byteOffset, 0);
    assert.equal(v.buffer.byteLength, data.length, 'its own buffer');
    if (Ctor.BYTES_PER_ELEMENT > 1) assertMalformed(typed([tag, ...data.slice(1)]), /^received a malformed typed-array record$/);
    assert.equal((value(typed([tag])) as ArrayBufferView).byteLength, 0);
  }
  const view = value(typed([DATA_VIEW_TAG, 1, 2, 3])) as DataView;
  assert.ok(view instanceof DataView);
  assert.deepEqual([view.byteLength, view.getUint8(2), view.buffer.byteLength], [3, 3, 3]);
  assertMalformed(typed([DATA_VIEW_TAG + 1, 1]), /^received a malformed typed-array record$/);
  assertMalformed(typed([0, 1]), /^received a malformed typed-array record$/);
  // No tag byte at all (the bytes after the payload in the buffer are 0x01: Uint8Array's tag).
  assertMalformed(typed([]), /^received a malformed typed-array record$/);
  const fds2 = memfds(1);
  assertMalformed(typed([1, 1], fds2), /^received a malformed typed-array record$/);
  assert.equal(fdIsOpen(fds2[0]!), false);
});

test('record placements: where each value goes, and every placement that does not point at a null placeholder', () => {
  const json = '{"a":null,"b":[1,null,{"c":null}],"d":{"0":null},"e":{"x":null},"f":{"x":null}}';
  const recs: Rec[] = [
    { kind: '@bigint', path: ['a'], data: '1' },
    { kind: '@bigint', path: ['b', 1], data: '2' },
    { kind: '@bigint', path: ['b', 2, 'c'], data: '3' },
    { kind: '@bigint', path: ['d', '0'], data: '4' },
    // The same key in two objects: two placeholders.
    { kind: '@bigint', path: ['e', 'x'], data: '5' },
    { kind: '@bigint', path: ['f', 'x'], data: '6' },
  ];
  assert.deepEqual(value(records(json, recs)), { a: 1n, b: [1, 2n, { c: 3n }], d: { 0: 4n }, e: { x: 5n }, f: { x: 6n } });
  // A record with the root as its placement, beside another: the root is its placeholder.
  assertMalformed(records('null', [{ kind: '@bigint', data: '1' }, { kind: '@bigint', path: ['a'], data: '2' }]), 'a record path leads through a non-container');
  assertMalformed(records('null', [{ kind: '@bigint', data: '1' }, { kind: '@bigint', data: '2' }]), 'two records point at the same placeholder');

  const bad: Array<[string, Seg[], string]> = [
    ['{"a":1,"z":null}', ['a', 'x'], 'a record path leads through a non-container'],
    ['{"a":null,"z":null}', ['a', 'x'], 'a record path leads through a non-container'],
    ['{"a":"text","z":null}', ['a', 0], 'a record path leads through a non-container'],
    ['{"a":{"0":null},"z":null}', ['a', 0], 'a record path does not match the JSON'],
    ['{"a":[null],"z":null}', ['a', '0'], 'a record path does not match the JSON'],
    ['{"a":1,"z":null}', ['a'], 'a record path does not point at a null placeholder'],
    ['{"a":[1],"z":null}', ['a', 0], 'a record path does not point at a null placeholder'],
    ['{"a":[null],"z":null}', ['a', 1], 'a record path does not point at a null placeholder'],
    ['{"a":{},"z":null}', ['a', 'toString'], 'a record path does not point at a null placeholder'],
    ['{"z":null}', ['b'], 'a record path does not point at a null placeholder'],
    ['{"a":null,"z":null}', ['z'], 'two records point at the same placeholder'],
  ];
  for (const [j, path, why] of bad) {
    const fds = memfds(2);
    const leases = new IncomingLeases(() => {});
    const d = records(j, [{ kind: '@bigint', path: ['z'], data: '1' }, { kind: 'test-dec-box', path, fds: 2, lease: 77 }], fds, leases);
    assertMalformed(d, why);
    assert.deepEqual(fds.map(fdIsOpen), [false, false], `${j} ${JSON.stringify(path)}: the fds were closed`);
    assert.equal(leases.count, 0, 'no lease was opened');
  }
  // A sole record (link.send(value)) needs a null root.
  assertMalformed(records('{}', [{ kind: '@bigint', data: '1' }]), 'a record path does not point at a null placeholder');
  assertMalformed(records('0', [{ kind: '@bigint', data: '1' }]), 'a record path does not point at a null placeholder');
});

test('fds: the count must match the records; each handler gets its own, in record order', () => {
  const fds = memfds(3);
  assertMalformed(records('null', [{ kind: 'test-dec-box', fds: 2 }], fds), 'records claim 2 fds but 3 arrived');
  assert.deepEqual(fds.map(fdIsOpen), [false, false, false]);
  assertMalformed(records('null', [{ kind: 'test-dec-box', fds: 1 }]), 'records claim 1 fds but 0 arrived');

  const mine = memfds(3);
  const v = value(records('[null,null,null]', [
    { kind: 'test-dec-box', path: [0], fds: 2, data: 'first' },
    { kind: '@bigint', path: [1], data: '5' },
    { kind: 'test-dec-box', path: [2], fds: 1, data: 'second' },
  ], [...mine])) as [Box, bigint, Box];
  assert.deepEqual([v[0].text, v[0].fds, v[1], v[2].text, v[2].fds], ['first', mine.slice(0, 2), 5n, 'second', mine.slice(2)]);
  assert.equal(v[0].link, link);
  assert.deepEqual(mine.map(fdIsOpen), [true, true, true], 'the handlers own them');
  closeAll(mine);
  // A sole value (link.send(buffer)) owns every fd.
  const sole = memfds(2);
  const b = value(records('null', [{ kind: 'test-dec-box', fds: 2, data: 'sole' }], [...sole])) as Box;
  assert.deepEqual(b.fds, sole);
  assert.deepEqual(sole.map(fdIsOpen), [true, true], 'the value owns them');
  closeAll(sole);
});

test('a handler that fails: only that message fails; values already decoded are disposed, fds not taken are closed', () => {
  const fds = memfds(5);
  const leases = new IncomingLeases(() => {});
  decoded.length = 0;
  const d = records('[null,null,null,null,null]', [
    { kind: 'test-dec-box', path: [0], fds: 1, lease: 11, data: 'kept' },
    { kind: 'test-dec-closer', path: [1] },
    { kind: 'test-dec-dispose-throws', path: [2] },
    { kind: 'test-dec-fail', path: [3], fds: 2, lease: 12, data: 'take-first' },
    { kind: 'test-dec-box', path: [4], fds: 2, lease: 13, data: 'never' },
  ], [...fds], leases);
  assert.ok(!d.ok);
  assert.equal(d.fatal, false, 'a handler failing is not a protocol error');
  assert.equal(d.error.code, 'ERR_DESCRIPTOR_INVALID');
  assert.match(d.error.message, /'test-dec-fail' transfer handler could not rebuild a received value: failed after taking one fd/);
  assert.equal((d.error.cause as Error).message, 'failed after taking one fd');
  assert.equal(decoded.length, 1, 'the record after the failure was never decoded');
  assert.equal(closers.at(-1)!.closed, 1, 'a value with close() and no Symbol.dispose was closed');
  assert.equal(decoded[0]!.disposed, 1, 'the value decoded before the failure was disposed');
  assert.equal(decoded[0]!.lease?.id, 11);
  assert.equal(decoded[0]!.lease?.ended, true);
  assert.equal(leases.count, 0, 'every lease the message granted was ended (11, 12 and 13)');
  // fds[0] belongs to the disposed value (its handler's to close), fds[1] to the failed handler
  // that took it; the rest were closed.
  assert.deepEqual(fds.map(fdIsOpen), [true, true, false, false, false]);
  closeAll(fds);

  // The handler took its second fd: that one stays open, the others close.
  const second = memfds(3);
  const t = records('[null,null]', [
    { kind: 'test-dec-box', path: [0], fds: 1 },
    { kind: 'test-dec-fail', path: [1], fds: 2, data: 'take-second' },
  ], [...second]);
  assert.ok(!t.ok && !t.fatal);
  assert.deepEqual(second.map(fdIsOpen), [true, false, true]);
  closeAll(second);

  // The sole value's handler fails: its lease ends, its fds close.
  const sole = memfds(2);
  const soleLeases = new IncomingLeases(() => {});
  const s = records('null', [{ kind: 'test-dec-fail', fds: 2, lease: 21, data: 'take-first' }], [...sole], soleLeases);
  assert.ok(!s.ok && !s.fatal && s.error.code === 'ERR_DESCRIPTOR_INVALID');
  assert.equal(soleLeases.count, 0);
  assert.deepEqual(sole.map(fdIsOpen), [true, false]);
  closeAll(sole);
});

test('what a handler throws decides the error: its own IpcError, fatal when marked so, anything else wrapped', () => {
  for (const sole of [true, false]) {
    const run = (mode: string): Decoded => (sole ? records('null', [{ kind: 'test-dec-fail', data: mode }]) : records('[1,null]', [{ kind: 'test-dec-fail', path: [1], data: mode }]));
    const ipc = run('ipc');
    assert.ok(!ipc.ok && ipc.error.code === ('ERR_HANDLE_STALE') && !ipc.fatal);
    assert.equal(ipc.error.message, 'the handler\'s own typed error');
    const fatal = run('fatal');
    assert.ok(!fatal.ok && fatal.fatal && fatal.error.code === 'ERR_DESCRIPTOR_INVALID');
    const undef = run('undefined');
    assert.ok(!undef.ok && !undef.fatal && undef.error.code === 'ERR_DESCRIPTOR_INVALID');
    assert.match(undef.error.message, /could not rebuild a received value: undefined$/);
    const str = run('string');
    assert.ok(!str.ok && !str.fatal);
    assert.match(str.error.message, /could not rebuild a received value: a thrown string$/);
  }
});

test('kinds: an unregistered kind or one the link\'s transport never carries fails the message, not the link', () => {
  for (const sole of [true, false]) {
    const run = (kind: string, transport: 'unix' | 'tcp', fds: number[]): Decoded =>
      sole
        ? records('null', [{ kind, fds: fds.length }], fds, undefined, transport)
        : records('[null,null]', [{ kind: '@bigint', path: [0], data: '1' }, { kind, path: [1], fds: fds.length }], fds, undefined, transport);
    const fds = memfds(1);
    const unknown = run('test-dec-nobody', 'unix', fds);
    assert.ok(!unknown.ok && !unknown.fatal && unknown.error.code === 'ERR_NOT_TRANSFERABLE');
    assert.match(unknown.error.message, /received a 'test-dec-nobody' but no transfer handler/);
    assert.equal(fdIsOpen(fds[0]!), false);
    const onTcp = run('test-dec-unix', 'tcp', []);
    assert.ok(!onTcp.ok && !onTcp.fatal && onTcp.error.code === 'ERR_NOT_TRANSFERABLE');
    assert.match(onTcp.error.message, /received a 'test-dec-unix' on a TCP link/);
    const onUnix = run('test-dec-tcp', 'unix', []);
    assert.ok(!onUnix.ok && onUnix.error.code === 'ERR_NOT_TRANSFERABLE');
    assert.match(onUnix.error.message, /received a 'test-dec-tcp' on a Unix-socket link/);
    assert.ok((value(run('test-dec-tcp', 'tcp', [])) as unknown[] | Box) !== undefined);
    assert.ok((value(run('test-dec-box', 'unix', [])) as unknown[] | Box) !== undefined);
  }
  // Kinds that share a prefix or a length are told apart (the decoder keeps recent kinds' bytes).
  for (const kind of ['@bigint', '@big', '@bigintx', 'zz-aa', 'zz-bb', 'zz-aa', 'xyzw', 'wxyz']) {
    const d = records('null', [{ kind, data: '1' }]);
    if (kind === '@bigint') assert.equal(value(d), 1n);
    else {
      assert.ok(!d.ok && d.error.code === 'ERR_NOT_TRANSFERABLE');
      assert.match(d.error.message, new RegExp(`received a '${kind}' but`));
    }
  }
  for (let i = 0; i < 40; i++) {
    const kind = `many-kinds-${i}`;
    const d = records('null', [{ kind, data: '1' }]);
    assert.ok(!d.ok && d.error.message.includes(`'${kind}'`));
  }
  assert.equal(value(records('null', [{ kind: '@bigint', data: '3' }])), 3n);
});

test('owned values: only what handlers rebuilt as objects, which the link disposes if the message is dropped', () => {
  const v = records('[null,null,null,null,null]', [
    { kind: 'test-dec-box', path: [0], data: 'a' },
    { kind: '@bigint', path: [1], data: '1' },
    { kind: '@typed-array', path: [2], data: new Uint8Array([1, 2]) },
    { kind: 'test-dec-number', path: [3], data: 'xyz' },
    { kind: 'test-dec-null', path: [4] },
  ]);
  assert.ok(v.ok);
  const arr = v.value as unknown[];
  assert.equal(arr[3], 3);
  assert.equal(arr[4], null);
  assert.deepEqual(v.owned, [arr[0]]);
  assert.ok(!('ready' in v), 'nothing deferred: usable at once');
  const none = records('[null]', [{ kind: '@typed-array', path: [0], data: new Uint8Array([1, 2]) }]);
  assert.ok(none.ok && none.owned === undefined);
  for (const [kind, owned] of [['test-dec-box', true], ['test-dec-number', false], ['test-dec-null', false], ['@typed-array', false]] as const) {
    const d = records('null', [{ kind, data: kind === '@typed-array' ? new Uint8Array([1, 2]) : 'q' }]);
    assert.ok(d.ok);
    assert.deepEqual(d.owned, owned ? [d.value] : undefined, kind);
    assert.ok(!('ready' in d));
  }
});

test('deferred values: the message is ready when every one of them is, and fails if one fails', async () => {
  let resolveA!: () => void;
  deferred.push(new Promise<void>((r) => (resolveA = r)));
  const sole = records('null', [{ kind: 'test-dec-defer', data: 'sole' }]);
  assert.ok(sole.ok && sole.ready !== undefined);
  assert.ok(sole.value instanceof Box, 'the value, not the DeferredValue');
  assert.deepEqual(sole.owned, [sole.value]);
  resolveA();
  assert.equal(await sole.ready, undefined);

  const one = Promise.resolve();
  deferred.push(one);
  const single = records('[null,1]', [{ kind: 'test-dec-defer', path: [0], data: 'one' }]);
  assert.ok(single.ok && single.ready === one, 'one deferred value: its own promise');
  assert.ok((single.value as unknown[])[0] instanceof Box);

  deferred.push(Promise.resolve(), Promise.resolve());
  const two = records('[null,null]', [{ kind: 'test-dec-defer', path: [0] }, { kind: 'test-dec-defer', path: [1] }]);
  assert.ok(two.ok && two.ready !== undefined);
  assert.equal(await two.ready, undefined, 'resolves to nothing');

  const failure = new Error('the bytes never came');
  deferred.push(Promise.resolve(), Promise.reject(failure));
  const failing = records('[null,null]', [{ kind: 'test-dec-defer', path: [0] }, { kind: 'test-dec-defer', path: [1] }]);
  assert.ok(failing.ok && failing.ready !== undefined);
  await assert.rejects(failing.ready, (e) => e === failure);
  assert.equal(deferred.length, 0);
});

test('leases: opened for leased handler records only, each id once; refused where they cannot be', () => {
  const leases = new IncomingLeases(() => {});
  const v = value(records('[null,null,null]', [
    { kind: 'test-dec-box', path: [0], lease: 5 },
    { kind: 'test-dec-box', path: [1] },
    { kind: 'test-dec-box', path: [2], lease: 2 ** 53 - 1 },
  ], undefined, leases)) as Box[];
  assert.deepEqual(v.map((b) => b.lease?.id), [5, undefined, 2 ** 53 - 1]);
  assert.equal(leases.count, 2);
  assert.ok(leases.isLive(5) && leases.isLive(2 ** 53 - 1) && !leases.isLive(0));
  // A live id again: refused before anything is decoded or opened.
  decoded.length = 0;
  assertMalformed(records('null', [{ kind: 'test-dec-box', lease: 5 }], undefined, leases), 'lease id 5 is already held');
  assertMalformed(records('[null,null]', [{ kind: 'test-dec-box', path: [0], lease: 6 }, { kind: 'test-dec-box', path: [1], lease: 5 }], undefined, leases), 'lease id 5 is already held');
  assertMalformed(records('[null,null]', [{ kind: 'test-dec-box', path: [0], lease: 8 }, { kind: 'test-dec-box', path: [1], lease: 8 }], undefined, leases), 'lease id 8 appears twice');
  assertMalformed(
    records('[null,null,null]', [{ kind: 'test-dec-box', path: [0], lease: 9 }, { kind: 'test-dec-box', path: [1] }, { kind: 'test-dec-box', path: [2], lease: 9 }], undefined, leases),
    'lease id 9 appears twice',
  );
  assert.equal(decoded.length, 0);
  assert.equal(leases.count, 2, 'no lease opened by a refused message');
  assertMalformed(records('[null]', [{ kind: '@typed-array', path: [0], lease: 3, data: new Uint8Array([1]) }], undefined, leases), "a leased '@typed-array' record");
  assertMalformed(records('null', [{ kind: 'test-dec-box', lease: 3 }]), 'a leased value where no lease can be received');
  // The sole value's lease.
  const sole = value(records('null', [{ kind: 'test-dec-box', lease: 30 }], undefined, leases)) as Box;
  assert.equal(sole.lease?.id, 30);
  assert.equal(leases.count, 3);
  const unleased = value(records('null', [{ kind: 'test-dec-box' }], undefined, leases)) as Box;
  assert.equal(unleased.lease, undefined);
  assert.equal(leases.count, 3);
});

test('leaseIdsOf: the ids a payload grants, without decoding; undefined for a malformed one or one naming an id twice', () => {
  const ids = (json: string, recs: Rec[]): number[] | undefined => {
    const { buf, start, end } = framed(build(json, recs).bytes);
    return leaseIdsOf(buf, start, end);
  };
  assert.deepEqual(ids('[null,null,null]', [{ kind: 'k', path: [0], lease: 4 }, { kind: 'k', path: [1] }, { kind: 'k', path: [2], lease: 2 }]), [4, 2]);
  assert.deepEqual(ids('null', [{ kind: 'k' }]), []);
  assert.equal(ids('[null,null]', [{ kind: 'k', path: [0], lease: 4 }, { kind: 'k', path: [1], lease: 4 }]), undefined);
  const { bytes } = build('null', [{ kind: 'k', lease: 4 }]);
  const { buf, start, end } = framed(bytes);
  assert.equal(leaseIdsOf(buf, start, end - 1), undefined);
  assert.equal(leaseIdsOf(buf, start, end + 1), undefined);
});

test('disposeValues: what a dropped message owned is disposed or closed; a plain message owns nothing, which is no error', () => {
  // The inbox drops unread messages this way when the link closes; a JSON message's `owned` is undefined.
  const plain = value(decode(0, Buffer.from('{"a":1}')));
  assert.deepEqual(plain, { a: 1 });
  const d = decode(0, Buffer.from('{"a":1}'));
  assert.ok(d.ok);
  disposeValues(d.owned);
  decoded.length = 0;
  const m = records('[null,null,null]', [{ kind: 'test-dec-box', path: [0] }, { kind: 'test-dec-closer', path: [1] }, { kind: 'test-dec-dispose-throws', path: [2] }]);
  assert.ok(m.ok && m.owned?.length === 3);
  disposeValues(m.owned);
  assert.equal(decoded[0]!.disposed, 1);
  assert.equal(closers.at(-1)!.closed, 1);
});
