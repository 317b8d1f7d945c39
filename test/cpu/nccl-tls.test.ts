// Issue 40.8: device memory on a tls:// link moves over NCCL, which does not encrypt: without
// { allowNcclInClear: true } the sender's send throws ERR_NCCL_UNENCRYPTED before anything goes out
// (nor NCCL is looked for), and a receiver fails such a message with ERR_NCCL_UNENCRYPTED and tells
// the sender (NCCL_ABORT reason 1). With the option the same paths go on to NCCL (here there is none:
// CUDA_IPC_NCCL_LIBRARY names a missing file, so they end with ERR_NCCL_UNAVAILABLE instead). A
// tcp:// link is not affected. No GPU needed: the sender's path is entered with a stand-in device,
// the receiver's with a raw TLS peer writing the record by hand.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { IpcError } from '../../src/errors.js';
import { connect, listen, type Link } from '../../src/link/index.js';
import { beginOutgoing } from '../../src/link/nccl/nccl-comms.js';
import { encodeNcclBuffer } from '../../src/link/messages/nccl-records.js';
import { buildRecordsFrame } from '../fixtures/link-fuzzer.js';
import { RawTcp, TOKEN, authenticateRaw, parseFrames, tcpHello } from '../fixtures/tcp-peer.js';
import { standInDevice } from '../helpers/nccl-testing.js';

process.env.CUDA_IPC_NCCL_LIBRARY = '/nonexistent/cuda-ipc-test/libnccl.so.2';

const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-nccl-tls-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const certificate = ((): { cert: Buffer; key: Buffer } | string => {
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  const r = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key,
    '-out', cert, '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'], { stdio: 'ignore' });
  return r.status === 0 ? { cert: readFileSync(cert), key: readFileSync(key) } : 'no openssl command to make a test certificate';
})();
const skip = typeof certificate === 'string' ? certificate : undefined;
const tlsFiles = () => certificate as { cert: Buffer; key: Buffer };

function ncclBufferMessage(id: Uint8Array): Uint8Array {
  const data = encodeNcclBuffer({ comm: { id, nranks: 2, rank: 1, broadcast: false, uniqueId: randomBytes(128) }, sequence: 0, byteLength: 4096, deviceUuid: new Uint8Array(16) });
  return buildRecordsFrame('null', [{ kind: 'nccl-buffer', path: [], fds: 0, lease: 1, data }]);
}

async function nextAbort(raw: RawTcp): Promise<{ id: string; reason: number; text: string }> {
  for (;;) {
    const abort = parseFrames(raw.received).find((f) => f.type === 9);
    if (abort) return { id: abort.payload.subarray(0, 16).toString('hex'), reason: abort.payload.readUInt32LE(16), text: abort.payload.subarray(24).toString('utf8') };
    if (raw.ended) throw new Error('the connection ended with no NCCL_ABORT');
    await Promise.race([once(raw.socket, 'data'), once(raw.socket, 'close')]);
  }
}

/** A tls:// listener (`options` for its links) and a raw TLS peer that authenticated and said HELLO. */
async function tlsLinkWithRawPeer(options: { allowNcclInClear?: boolean }): Promise<{ link: Link; raw: RawTcp; close(): Promise<void> }> {
  const { cert, key } = tlsFiles();
  const listener = await listen('tls://127.0.0.1:0', { token: TOKEN, tls: { cert, key }, ...options });
  const socket = tls.connect({ host: '127.0.0.1', port: listener.port, ca: cert });
  await once(socket, 'secureConnect');
  const raw = new RawTcp(socket);
  assert.equal(await authenticateRaw(raw), true);
  raw.send(tcpHello());
  const link = await listener.accept();
  return { link, raw, close: async () => { link.close(); raw.destroy(); await listener.close(); } };
}

test('receiving device memory on a tls:// link: ERR_NCCL_UNENCRYPTED and NCCL_ABORT without the option; on to NCCL with it', { skip, timeout: 60_000 }, async () => {
  for (const allow of [false, true]) {
    const { link, raw, close } = await tlsLinkWithRawPeer(allow ? { allowNcclInClear: true } : {});
    try {
      const id = randomBytes(16);
      raw.send(ncclBufferMessage(id));
      const expected = allow ? 'ERR_NCCL_UNAVAILABLE' : 'ERR_NCCL_UNENCRYPTED';
      await assert.rejects(link.receive({ timeout: 30_000 }), (e: unknown) => {
        assert.ok(e instanceof IpcError, String(e));
        assert.equal(e.code, expected);
        if (!allow) assert.match(e.message, /NCCL does not encrypt.*in clear, outside TLS.*allowNcclInClear: true/);
        return true;
      });
      const abort = await nextAbort(raw);
      assert.deepEqual([abort.id, abort.reason], [id.toString('hex'), 1]);
      if (!allow) assert.match(abort.text, /NCCL does not encrypt/);
      assert.equal(link.closed, false, 'the link goes on');
    } finally {
      await close();
    }
  }
});

test('sending device memory on a tls:// link throws ERR_NCCL_UNENCRYPTED before NCCL is looked for; the option lets it on; tcp:// is not affected', { skip, timeout: 60_000 }, async () => {
  const { cert, key } = tlsFiles();
  const device = standInDevice(0);
  const outcome = (f: () => unknown): string => {
    try {
      f();
      return 'went on';
    } catch (e) {
      return (e as { code?: string }).code ?? String(e);
    }
  };
  for (const [scheme, allow, expected] of [['tls', false, 'ERR_NCCL_UNENCRYPTED'], ['tls', true, 'ERR_NCCL_UNAVAILABLE'], ['tcp', false, 'ERR_NCCL_UNAVAILABLE']] as const) {
    const listener = await listen(`${scheme}://127.0.0.1:0`, { token: TOKEN, ...(scheme === 'tls' ? { tls: { cert, key } } : {}) });
    try {
      const [a, b] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN, ...(scheme === 'tls' ? { tls: { ca: cert } } : {}), ...(allow ? { allowNcclInClear: true } : {}) })]);
      try {
        assert.equal(outcome(() => beginOutgoing(b, device)), expected, `${scheme}:// ${allow ? 'with' : 'without'} the option`);
        if (expected === 'ERR_NCCL_UNENCRYPTED') {
          assert.throws(() => beginOutgoing(b, device), /link\.send: this tls:\/\/ link moves device memory over NCCL, and NCCL does not encrypt.*\{ allowNcclInClear: true \}.*allow_nccl_in_clear=True/);
        }
      } finally {
        a.close();
        b.close();
      }
    } finally {
      await listener.close();
    }
  }
  await assert.rejects(listen('tcp://127.0.0.1:0', { token: TOKEN, allowNcclInClear: 'yes' as unknown as boolean }), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_TYPE');
});
