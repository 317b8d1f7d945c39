// safe-files.ts directly (issue 41's mutation testing): every refusal with its code and reason,
// the size bounds at their edge, files that grow while read (/proc files say size 0), and no fd
// left open after a refusal. security-files.test.ts has the attacks through the CLI and links.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chownSync, closeSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  describeEntry, identityOf, inDirectory, openDirectory, openRegularFile, openRegularFileHandle, readRegularFile,
  readRegularFileAsync, removeIfSame, sameFile, writeFileAtomic,
} from '../../src/safe-files.js';

const unsafe = (message: RegExp) => ({ code: 'ERR_FILE_UNSAFE', message });
const openFds = () => readdirSync('/proc/self/fd').length;

/** A fresh directory holding a 5-byte file, a symlink to it, a directory, a FIFO and a socket. */
async function playground() {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-safe-files-'));
  const file = join(dir, 'file');
  writeFileSync(file, 'hello');
  symlinkSync(file, join(dir, 'link'));
  mkdirSync(join(dir, 'dir'));
  symlinkSync(join(dir, 'dir'), join(dir, 'dirlink'));
  execFileSync('mkfifo', [join(dir, 'fifo')]);
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(join(dir, 'sock'), resolve));
  const done = async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  };
  return { dir, file, done };
}

test('readRegularFile: a file of exactly maxBytes is read, one byte more is refused before reading', async () => {
  const { dir, file, done } = await playground();
  try {
    const fds = openFds();
    const r = readRegularFile(file, { maxBytes: 5, what: 'the file' });
    assert.equal(r.bytes.toString(), 'hello');
    assert.ok(sameFile(r.identity, identityOf(statSync(file))));
    assert.equal(r.stats.size, 5);
    assert.throws(() => readRegularFile(file, { maxBytes: 4, what: 'the file' }), unsafe(new RegExp(`^the file ${file} holds 5 bytes, more than the 4 it may$`)));
    writeFileSync(join(dir, 'empty'), '');
    assert.equal(readRegularFile(join(dir, 'empty'), { maxBytes: 0, what: 'x' }).bytes.byteLength, 0, 'an empty file with a bound of 0');
    assert.equal(openFds(), fds, 'no fd left open');
  } finally {
    await done();
  }
});

test('openRegularFile and readRegularFile refuse every kind of non-file with its reason, leaving no fd open', async () => {
  const { dir, done } = await playground();
  try {
    const fds = openFds();
    const read = (name: string, followSymlinks?: boolean) => readRegularFile(join(dir, name), { maxBytes: 100, what: 'the thing', followSymlinks });
    assert.throws(() => read('link'), unsafe(/the thing .*\/link is a symbolic link; give the file itself/));
    assert.equal(read('link', true).bytes.toString(), 'hello', 'followed when asked');
    assert.throws(() => read('dir'), unsafe(/\/dir is a directory, not a regular file$/));
    assert.throws(() => read('fifo'), unsafe(/\/fifo is a FIFO, not a regular file/), 'a FIFO opens without blocking and is refused');
    assert.throws(() => read('sock'), unsafe(/\/sock is a socket or a device without a driver/));
    assert.throws(() => readRegularFile('/dev/null', { maxBytes: 1, what: 'a device' }), unsafe(/\/dev\/null is a device, not a regular file/));
    assert.throws(() => read('dirlink', true), unsafe(/is a directory, not a regular file/));
    assert.throws(() => read('missing'), { code: 'ENOENT' }, 'ENOENT passes through');
    assert.throws(() => openRegularFile(join(dir, 'fifo'), { maxBytes: 1, what: 'x' }), unsafe(/a FIFO/));
    assert.equal(openFds(), fds, 'every refusal closed what it opened');
  } finally {
    await done();
  }
});

test('readRegularFile: a file that grows past maxBytes while read is refused; one that stays within it is read whole', () => {
  // /proc files say size 0 and hold more: the buffer grows as the file is read.
  const cmdline = readFileSync('/proc/self/cmdline');
  assert.ok(cmdline.byteLength > 8 && statSync('/proc/self/cmdline').size === 0);
  const whole = readRegularFile('/proc/self/cmdline', { maxBytes: cmdline.byteLength, what: 'cmdline' });
  assert.deepEqual(whole.bytes, cmdline, 'exactly maxBytes: read whole, across several growths');
  assert.throws(() => readRegularFile('/proc/self/cmdline', { maxBytes: cmdline.byteLength - 1, what: 'cmdline' }),
    unsafe(new RegExp(`grew past ${cmdline.byteLength - 1} bytes while it was read`)));
  assert.throws(() => readRegularFile('/proc/self/cmdline', { maxBytes: 0, what: 'cmdline' }), unsafe(/grew past 0 bytes/));
  // A file that fills its growing buffer exactly at maxBytes is within the bound: a child whose
  // /proc/self/cmdline is 512 bytes (buffers 1, 2, ... 512) reads it with a bound of 512, not 511.
  const moduleUrl = new URL('../../src/safe-files.js', import.meta.url).href;
  const script = 'import(process.argv[1]).then((m) => { try { console.log(m.readRegularFile("/proc/self/cmdline", { maxBytes: +process.argv[2], what: "x" }).bytes.length); } catch (e) { console.log(e.code); } })';
  const child = (maxBytes: number) => {
    const fixed = [process.execPath, '-e', script, moduleUrl, String(maxBytes), ''].reduce((n, a) => n + Buffer.byteLength(a) + 1, 0);
    return execFileSync(process.execPath, ['-e', script, moduleUrl, String(maxBytes), 'x'.repeat(512 - fixed)], { encoding: 'utf8' }).trim();
  };
  assert.equal(child(512), '512');
  assert.equal(child(511), 'ERR_FILE_UNSAFE');
  // The buffer follows the file, not the bound: a bound of 2^53 allocates nothing near it.
  assert.deepEqual(readRegularFile('/proc/self/cmdline', { maxBytes: Number.MAX_SAFE_INTEGER, what: 'cmdline' }).bytes, cmdline);
  assert.equal(readRegularFile(new URL(import.meta.url).pathname, { maxBytes: Number.MAX_SAFE_INTEGER, what: 'x' }).stats.isFile(), true);
});

test('the promise API: bounds, growth and refusals', async () => {
  const { dir, file, done } = await playground();
  try {
    const fds = openFds();
    assert.equal((await readRegularFileAsync(file, 5, 'the file')).toString(), 'hello');
    assert.equal((await readRegularFileAsync(join(dir, 'link'), 5, 'the file')).toString(), 'hello', 'a symlink is followed');
    await assert.rejects(readRegularFileAsync(file, 4, 'the file'), unsafe(/holds 5 bytes, more than the 4 it may/));
    await assert.rejects(readRegularFileAsync('/proc/self/cmdline', 1 << 20, 'cmdline'), unsafe(/cmdline \/proc\/self\/cmdline grew while it was read/));
    await assert.rejects(readRegularFileAsync(join(dir, 'dir'), 5, 'the file'), unsafe(/\/dir is a directory, not a regular file$/));
    await assert.rejects(readRegularFileAsync(join(dir, 'fifo'), 5, 'the file'), unsafe(/\/fifo is a FIFO, not a regular file/));
    await assert.rejects(readRegularFileAsync(join(dir, 'sock'), 5, 'the file'), unsafe(/a socket or a device without a driver/));
    await assert.rejects(readRegularFileAsync(join(dir, 'missing'), 5, 'the file'), { code: 'ENOENT' });
    const fh = await openRegularFileHandle(file, 'the file');
    assert.equal((await fh.stat()).size, 5);
    await fh.close();
    assert.equal(openFds(), fds, 'no fd left open');
  } finally {
    await done();
  }
});

test('writeFileAtomic: strings, bytes and chunks land whole, mode 0600 unless told, no temporary left; it replaces only what its policy allows', async () => {
  const { dir, file, done } = await playground();
  try {
    const target = join(dir, 'out');
    const id = writeFileAtomic(target, 'text');
    assert.equal(readFileSync(target, 'utf8'), 'text');
    assert.ok(sameFile(id, identityOf(statSync(target))));
    assert.equal(statSync(target).mode & 0o777, 0o600);
    assert.throws(() => writeFileAtomic(target, 'again'), unsafe(/already holds a regular file/), 'never replaces by default');
    assert.equal(readFileSync(target, 'utf8'), 'text');
    const second = writeFileAtomic(target, new Uint8Array([1, 2, 3]), { mode: 0o640, replace: id });
    assert.deepEqual([...readFileSync(target)], [1, 2, 3]);
    assert.equal(statSync(target).mode & 0o777, 0o640);
    assert.throws(() => writeFileAtomic(target, 'x', { replace: id }), unsafe(/./), 'an identity that is no longer the file there replaces nothing');
    const big = Buffer.alloc(300_000, 7);
    writeFileAtomic(target, [new Uint8Array([9]), big, new Uint8Array(0)], { replace: second });
    const got = readFileSync(target);
    assert.equal(got.byteLength, 300_001);
    assert.equal(got[0], 9);
    assert.equal(got[300_000], 7);
    // A symlink at the path is refused even where a regular file of ours would be replaced; what it points to is untouched.
    assert.throws(() => writeFileAtomic(join(dir, 'link'), 'new', { replace: 'own-regular-file' }), unsafe(/symbolic link/));
    assert.ok(lstatSync(join(dir, 'link')).isSymbolicLink());
    assert.equal(readFileSync(file, 'utf8'), 'hello');
    assert.throws(() => writeFileAtomic(join(dir, 'dir'), 'no', { replace: 'own-regular-file' }), unsafe(/directory/));
    assert.throws(() => writeFileAtomic(join(dir, 'nowhere', 'f'), 'no'), { code: 'ENOENT' });
    assert.deepEqual(readdirSync(dir).filter((n) => n.endsWith('.tmp') || n.startsWith('.')), [], 'no temporary left behind');
  } finally {
    await done();
  }
});

test('removeIfSame removes only the file it names; describeEntry says what an entry is without following it', async () => {
  const { dir, file, done } = await playground();
  try {
    const id = identityOf(statSync(file));
    const other = join(dir, 'other');
    writeFileSync(other, '');
    assert.equal(removeIfSame(other, id), false, 'another file under the identity: left');
    assert.ok(statSync(other).isFile());
    assert.equal(removeIfSame(file, { dev: id.dev, ino: id.ino + 1 }), false);
    assert.equal(removeIfSame(file, { dev: id.dev + 1, ino: id.ino }), false);
    assert.equal(removeIfSame(join(dir, 'link'), undefined), false, 'no identity: a symlink is not ours to remove');
    assert.equal(removeIfSame(join(dir, 'dir'), undefined), false, 'nor a directory');
    assert.equal(removeIfSame(join(dir, 'missing'), undefined), false);
    assert.equal(describeEntry(file), `a file of uid ${process.getuid!()}`);
    assert.equal(describeEntry(join(dir, 'link')), `a symbolic link of uid ${process.getuid!()}`);
    assert.equal(describeEntry(join(dir, 'dir')), `a directory of uid ${process.getuid!()}`);
    assert.equal(describeEntry(join(dir, 'sock')), `a socket of uid ${process.getuid!()}`);
    assert.equal(describeEntry(join(dir, 'fifo')), `a special file of uid ${process.getuid!()}`);
    assert.equal(describeEntry(join(dir, 'missing')), undefined);
    assert.equal(removeIfSame(file, id), true);
    assert.equal(describeEntry(file), undefined, 'gone');
    assert.equal(removeIfSame(other, undefined), true, 'no identity: a regular file of ours is removed');
  } finally {
    await done();
  }
});

test('openDirectory refuses a symlink unless told to follow; inDirectory names an entry through the open directory', async () => {
  const { dir, done } = await playground();
  try {
    assert.throws(() => openDirectory(join(dir, 'dirlink'), false), (e: unknown) => ['ELOOP', 'ENOTDIR'].includes((e as { code?: string }).code!));
    assert.throws(() => openDirectory(join(dir, 'file'), true), { code: 'ENOTDIR' });
    const d = openDirectory(join(dir, 'dirlink'), true);
    try {
      assert.ok(d.stats.isDirectory());
      assert.ok(sameFile(identityOf(d.stats), identityOf(statSync(join(dir, 'dir')))));
      writeFileSync(inDirectory(d.fd, 'inside'), 'x');
      assert.equal(inDirectory(d.fd, 'inside'), `/proc/self/fd/${d.fd}/inside`);
      assert.equal(readFileSync(join(dir, 'dir', 'inside'), 'utf8'), 'x');
    } finally {
      closeSync(d.fd);
    }
  } finally {
    await done();
  }
});

const root = process.getuid?.() === 0;
test('removeIfSame without an identity leaves a regular file of another user', { skip: root ? undefined : 'needs root, to give a file to another uid' }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-safe-files-'));
  try {
    const theirs = join(dir, 'theirs');
    writeFileSync(theirs, '');
    chownSync(theirs, 65534, 65534);
    assert.equal(removeIfSame(theirs, undefined), false);
    assert.ok(statSync(theirs).isFile(), 'still there');
    assert.equal(describeEntry(theirs), 'a file of uid 65534');
    assert.equal(removeIfSame(theirs, identityOf(statSync(theirs))), true, 'with its identity it is removed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
