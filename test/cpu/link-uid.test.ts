import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, chmodSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { listen, spawn } from '../../src/link/index.js';
import { cannotRunAsNobody, lookupUser } from '../fixtures/users.js';

const CHILD = new URL('../fixtures/link-child.js', import.meta.url);
const CONNECT_CHILD = new URL('../fixtures/connect-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
const skip = cannotRunAsNobody(CHILD);
const nobody = lookupUser('nobody') ?? { uid: 65534, gid: 65534 };

test('a spawned child running as another uid is refused with ERR_PEER_REFUSED', { skip }, async () => {
  await assert.rejects(
    spawn(CHILD, [], { uid: nobody.uid, gid: nobody.gid, stdio: 'ignore' }),
    (e: unknown) => code('ERR_PEER_REFUSED')(e) && new RegExp(`uid ${nobody.uid}`).test((e as Error).message),
  );
});

test('allowUids admits a child running as another uid', { skip }, async () => {
  const { child, link } = await spawn(CHILD, [], { uid: nobody.uid, gid: nobody.gid, allowUids: [nobody.uid] });
  assert.equal(link.peer.uid, nobody.uid);
  link.send({ op: 'whoami' });
  const who = (await link.receive()) as { uid: number };
  assert.equal(who.uid, nobody.uid);
  await link.end();
  await once(child, 'exit');
});

test('a listener refuses a connection from another uid (SO_PEERCRED) unless allowed', { skip }, async () => {
  // A directory 'nobody' can reach; the default one is private to this user.
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-uid-'));
  chmodSync(dir, 0o755);
  try {
    for (const allow of [false, true]) {
      const name = `uid-${allow}`;
      using listener = listen(name, { directory: dir, allowUids: allow ? [nobody.uid] : [] });
      if (!allow) {
        // Without allowUids the socket file itself is 0600: open it up to reach the uid check.
        chmodSync(listener.path, 0o666);
      }
      const refused = new Promise<unknown>((resolve) => listener.once('refused', resolve));
      // The child in turn must accept a listener running as root.
      const { child, link } = await spawn(CONNECT_CHILD, [name, dir, String(process.getuid!())], {
        uid: nobody.uid,
        gid: nobody.gid,
        allowUids: [nobody.uid],
      });
      try {
      const report = (await link.receive()) as { connected: boolean; code?: string };
      if (allow) {
        assert.deepEqual(report, { connected: true });
        const conn = await listener.accept();
        assert.equal(conn.peer.uid, nobody.uid);
        conn.send('hi');
        assert.equal(await link.receive(), 'hi');
        conn.close();
      } else {
        assert.deepEqual(report, { connected: false, code: 'ERR_PEER_REFUSED' });
        assert.ok(code('ERR_PEER_REFUSED')(await refused));
      }
      } finally {
        await link.end();
        await once(child, 'exit');
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('connect() as another uid: a socket file it may not open is ERR_PEER_REFUSED (permission denied); a listener whose uid it does not allow is refused', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-uid-'));
  chmodSync(dir, 0o755);
  try {
    // No allowUids: the socket file is 0600, which 'nobody' cannot open.
    {
      using listener = listen('private', { directory: dir });
      const { child, link } = await spawn(CONNECT_CHILD, ['private', dir, String(process.getuid!())], { uid: nobody.uid, gid: nobody.gid, allowUids: [nobody.uid] });
      try {
        // The system's refusal is the cause: permission denied on the socket file.
        assert.deepEqual(await link.receive(), { connected: false, code: 'ERR_PEER_REFUSED', cause: 'EACCES' });
      } finally {
        await link.end();
        await once(child, 'exit');
      }
      listener.close();
    }
    // The listener admits 'nobody', but 'nobody' does not allow the listener's uid (root here).
    {
      using listener = listen('not-allowed', { directory: dir, allowUids: [nobody.uid] });
      const refused = new Promise<unknown>((resolve) => listener.once('refused', resolve));
      const { child, link } = await spawn(CONNECT_CHILD, ['not-allowed', dir], { uid: nobody.uid, gid: nobody.gid, allowUids: [nobody.uid] });
      try {
        assert.deepEqual(await link.receive(), { connected: false, code: 'ERR_PEER_REFUSED' });
        // The connecting side's refusal reaches the listener too.
        assert.ok(code('ERR_PEER_REFUSED')(await refused));
      } finally {
        await link.end();
        await once(child, 'exit');
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
