import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostBuffer } from '../../src/host/index.js';
import { addon } from '../../src/native/addon.js';
import { fdIsOpen } from '../fixtures/fd-count.js';
import { argError } from '../helpers/arg-error.js';

const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

test('allocate gives zeroed shared memory with an fd, address and byteLength', () => {
  using b = HostBuffer.allocate(10_000);
  assert.equal(b.byteLength, 10_000);
  assert.equal(b.byteOffset, 0);
  assert.equal(b.bytes.byteLength, 10_000);
  assert.ok(b.bytes.every((x) => x === 0));
  assert.equal(typeof b.address, 'bigint');
  assert.notEqual(b.address, 0n);
  assert.ok(fdIsOpen(b.fd));
  assert.equal(addon.fstatSize(b.fd), 10_000);
  assert.equal(b.bytes, b.bytes, 'bytes is the same view every time');
});

test('allocate rejects sizes that are not positive integers', () => {
  for (const bad of [0, -1, 1.5, Number.NaN]) assert.throws(() => HostBuffer.allocate(bad), argError('ERR_OUT_OF_RANGE'));
  using b = HostBuffer.allocate(16n);
  assert.equal(b.byteLength, 16);
});

test('write, read (copy and into dst) and fill', () => {
  using b = HostBuffer.allocate(64);
  b.write(new Uint8Array([1, 2, 3]), 10);
  b.write(new Uint16Array([0x0504]), 13);
  assert.deepEqual([...b.read(10, 5)], [1, 2, 3, 4, 5]);
  const copy = b.read(10, 3);
  copy[0] = 99;
  assert.equal(b.bytes[10], 1, 'read(offset, length) returns a copy');
  const dst = new Uint8Array(4);
  assert.equal(b.read(dst, 11), dst);
  assert.deepEqual([...dst], [2, 3, 4, 5]);
  assert.equal(b.read().byteLength, 64);
  b.fill(0xab);
  assert.ok(b.bytes.every((x) => x === 0xab));
  assert.throws(() => b.write(new Uint8Array(10), 60), argError('ERR_OUT_OF_RANGE'));
  assert.throws(() => b.read(60, 10), argError('ERR_OUT_OF_RANGE'));
  assert.throws(() => b.read(new Uint8Array(65)), argError('ERR_OUT_OF_RANGE'));
  assert.throws(() => b.fill(256), argError('ERR_OUT_OF_RANGE'));
  assert.throws(() => b.fill('1' as never), argError('ERR_INVALID_ARG_TYPE'));
  assert.throws(() => b.write('abc' as never), argError('ERR_INVALID_ARG_TYPE'));
  assert.throws(() => b.write(new Uint8Array(1), -1), argError('ERR_OUT_OF_RANGE'));
});

test('dataView: one DataView over the buffer (a view: its own range), unusable once closed', () => {
  const b = HostBuffer.allocate(64);
  const view = b.dataView;
  assert.equal(b.dataView, view, 'the same object every time');
  view.setUint32(4, 0xdeadbeef, true);
  assert.deepEqual([...b.read(4, 4)], [0xef, 0xbe, 0xad, 0xde]);
  {
    using part = b.view(4, 8);
    assert.equal(part.dataView.byteLength, 8);
    assert.equal(part.dataView.getUint32(0, true), 0xdeadbeef);
  }
  b.close();
  assert.throws(() => view.getUint32(0), TypeError, 'detached with the buffer');
  assert.throws(() => b.dataView, code('ERR_CLOSED'));
});

test('close detaches bytes so stale views read as empty, closes the fd, and is idempotent', () => {
  const b = HostBuffer.allocate(4096);
  const fd = b.fd;
  const bytes = b.bytes;
  const words = new Int32Array(bytes.buffer);
  bytes[0] = 1;
  b.close();
  b.close();
  assert.equal(b.closed, true);
  assert.equal(bytes.byteLength, 0);
  assert.equal(words.length, 0);
  assert.equal(bytes[0], undefined, 'no access to unmapped memory');
  assert.equal(fdIsOpen(fd), false);
  assert.throws(() => b.bytes, code('ERR_CLOSED'));
  assert.throws(() => b.write(new Uint8Array(1)), code('ERR_CLOSED'));
  assert.throws(() => b.fd, code('ERR_CLOSED'));
});

test('views share memory and keep the mapping until the last one closes', () => {
  const parent = HostBuffer.allocate(8192);
  const fd = parent.fd;
  const v = parent.view(4096, 100);
  const vv = v.view(10);
  assert.equal(v.byteOffset, 4096);
  assert.equal(vv.byteOffset, 4106);
  assert.equal(vv.byteLength, 90);
  assert.equal(v.address, parent.address + 4096n);
  v.fill(7);
  assert.equal(parent.bytes[4096], 7);
  assert.equal(parent.bytes[4196], 0);
  const parentBytes = parent.bytes;
  assert.equal(parent.bytes, parentBytes, 'bytes is the same Uint8Array every time');
  parent.close();
  assert.equal(parentBytes.byteLength, 0, 'the closed parent goes dark even while its views keep the mapping');
  assert.equal(v.bytes[0], 7, 'the view still works after its parent closed');
  assert.ok(fdIsOpen(fd));
  const vBytes = v.bytes;
  v.close();
  assert.equal(vBytes.byteLength, 0, 'a closed view goes dark even while the mapping stays');
  assert.equal(vv.bytes[0], 7);
  vv.close();
  assert.equal(fdIsOpen(fd), false, 'the last view released the fd');
  const p2 = HostBuffer.allocate(100);
  assert.throws(() => p2.view(50, 51), argError('ERR_OUT_OF_RANGE'));
  assert.throws(() => p2.view(0, 0), argError('ERR_OUT_OF_RANGE'));
  p2.close();
});

test('fromFd maps an existing memfd and owns the fd only once it returns', () => {
  using a = HostBuffer.allocate(4096);
  a.fill(5);
  const fd = addon.dup(a.fd);
  const tooBig = () => HostBuffer.fromFd(fd, 8192);
  assert.throws(tooBig, argError('ERR_OUT_OF_RANGE'));
  assert.ok(fdIsOpen(fd), 'a failed fromFd leaves the fd to the caller');
  const b = HostBuffer.fromFd(fd);
  assert.equal(b.byteLength, 4096);
  assert.equal(b.bytes[100], 5);
  b.bytes[100] = 6;
  assert.equal(a.bytes[100], 6, 'both map the same memory');
  b.close();
  assert.equal(fdIsOpen(fd), false);
  assert.throws(() => HostBuffer.fromFd(-1), argError('ERR_OUT_OF_RANGE'));
});

test('the memfd is sealed against resizing', () => {
  using b = HostBuffer.allocate(4096);
  assert.throws(() => addon.ftruncate(b.fd, 10), code('EPERM'));
  assert.throws(() => addon.ftruncate(b.fd, 1 << 20), code('EPERM'));
});

test('released() resolves once the buffer and all its views are closed', async () => {
  const b = HostBuffer.allocate(4096);
  const fd = b.fd;
  const v = b.view(0, 16);
  let released = false;
  void b.released().then(() => (released = true));
  assert.equal(b.leases, 0);
  b.close();
  await new Promise((r) => setImmediate(r));
  assert.equal(released, false, 'the view still maps the memory');
  assert.ok(fdIsOpen(fd));
  v.close();
  await b.released();
  await v.released();
  assert.equal(released, true);
  assert.equal(fdIsOpen(fd), false);
});

test('close({ force: true }) unmaps at once: every view goes dark and reads as closed', async () => {
  const b = HostBuffer.allocate(8192);
  const fd = b.fd;
  const v = b.view(4096);
  const viewBytes = v.bytes;
  v.fill(1);
  b.close({ force: true });
  await b.released();
  assert.equal(fdIsOpen(fd), false);
  assert.equal(b.closed, true);
  assert.equal(v.closed, true);
  assert.equal(viewBytes.byteLength, 0, 'no access to unmapped memory through an old view');
  assert.throws(() => v.bytes, code('ERR_CLOSED'));
  assert.throws(() => v.view(0), code('ERR_CLOSED'));
  v.close();
  v.close({ force: true });  // nothing left to do: no throw
});
