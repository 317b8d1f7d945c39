// Issue 40.7: an nccl-buffer record arriving where NCCL cannot be loaded (PROTOCOL.md 8.4). The Node
// and the Python receiver answer alike: that message fails with ERR_NCCL_UNAVAILABLE, the link stays
// open, and the sender gets NCCL_ABORT reason 1 naming the communicator. NCCL is made unavailable
// for certain with CUDA_IPC_NCCL_LIBRARY naming a file that does not exist (it is then the only
// place looked in), so the test means the same on a machine that has NCCL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn as spawnProcess } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { IpcError } from '../../src/errors.js';
import { encodeNcclBuffer } from '../../src/link/messages/nccl-records.js';
import { buildRecordsFrame } from '../fixtures/link-fuzzer.js';
import { RawTcp, TOKEN, authenticateRaw, jsonFrame, parseFrames, tcpHello, tcpLinkWithRawPeer } from '../fixtures/tcp-peer.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython } from '../helpers/python.js';

const NO_NCCL = '/nonexistent/cuda-ipc-test/libnccl.so.2';
process.env.CUDA_IPC_NCCL_LIBRARY = NO_NCCL;

/** A MESSAGE carrying one nccl-buffer record of 4096 bytes on a new communicator `id` (its unique id with it). */
function ncclBufferMessage(id: Uint8Array): Uint8Array {
  const data = encodeNcclBuffer({
    comm: { id, nranks: 2, rank: 1, broadcast: false, uniqueId: randomBytes(128) },
    sequence: 0, byteLength: 4096, deviceUuid: new Uint8Array(16),
  });
  return buildRecordsFrame('null', [{ kind: 'nccl-buffer', path: [], fds: 0, lease: 1, data }]);
}

/** What `raw` received until an NCCL_ABORT (type 9) came: its communicator id, reason and text. */
async function ncclAbortFrom(raw: RawTcp): Promise<{ id: string; reason: number; text: string }> {
  const seen: Array<{ type: number; payload: Buffer }> = [];
  for (;;) {
    const frames = parseFrames(raw.received);
    const abort = frames.find((f) => f.type === 9);
    if (abort) return { id: abort.payload.subarray(0, 16).toString('hex'), reason: abort.payload.readUInt32LE(16), text: abort.payload.subarray(24).toString('utf8') };
    if (raw.ended) throw new Error(`the connection ended with no NCCL_ABORT (frames: ${frames.map((f) => f.type).join(', ')}; ${seen.length})`);
    await new Promise<void>((resolve) => {
      raw.socket.once('data', () => resolve());
      raw.socket.once('close', () => resolve());
    });
  }
}

test('Node: an nccl-buffer record without NCCL fails its message with ERR_NCCL_UNAVAILABLE and sends NCCL_ABORT reason 1; the link goes on', { timeout: 60_000 }, async () => {
  const { listener, raw, link: linkP } = await tcpLinkWithRawPeer();
  try {
    raw.send(tcpHello());
    const link = await linkP;
    const id = randomBytes(16);
    raw.send(ncclBufferMessage(id));
    await assert.rejects(link.receive({ timeout: 30_000 }), (e: unknown) => {
      assert.ok(e instanceof IpcError, String(e));
      assert.equal(e.code, 'ERR_NCCL_UNAVAILABLE');
      return true;
    });
    const abort = await ncclAbortFrom(raw);
    assert.equal(abort.id, id.toString('hex'));
    assert.equal(abort.reason, 1);
    assert.match(abort.text, /NCCL/);
    raw.send(jsonFrame('"after"'));
    assert.equal(await link.receive({ timeout: 10_000 }), 'after', 'the link stays open');
    link.close();
  } finally {
    raw.destroy();
    await listener.close();
  }
});

const PY_LISTENER = `
import json, sys, cuda_ipc
from cuda_ipc import IpcError
with cuda_ipc.listen("tcp://127.0.0.1:0") as server:
    print(json.dumps({"url": server.url}), flush=True)
    with server.accept(timeout=30) as link:
        try:
            link.receive(timeout=30)
            print(json.dumps({"error": None}), flush=True)
        except IpcError as e:
            print(json.dumps({"error": e.code, "open": not link.closed}), flush=True)
        print(json.dumps({"next": link.receive(timeout=30)}), flush=True)
`;

test('Python answers the same record alike: ERR_NCCL_UNAVAILABLE, NCCL_ABORT reason 1, the link goes on', { skip: noPython, timeout: 60_000 }, async () => {
  const child = spawnProcess(PYTHON, ['-c', PY_LISTENER], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR, CUDA_IPC_TOKEN: TOKEN, CUDA_IPC_NCCL_LIBRARY: NO_NCCL },
  });
  const lines = createInterface({ input: child.stdout });
  const out: Array<Record<string, unknown>> = [];
  const next = async (): Promise<Record<string, unknown>> => {
    while (out.length === 0) {
      const [line] = (await Promise.race([once(lines, 'line'), once(child, 'exit').then(() => [undefined])])) as [string | undefined];
      if (line === undefined) throw new Error(`the Python listener exited (code ${child.exitCode})`);
      out.push(JSON.parse(line));
    }
    return out.shift()!;
  };
  let raw: RawTcp | undefined;
  try {
    const { url } = (await next()) as { url: string };
    raw = await RawTcp.connect(Number(new URL(url).port));
    assert.equal(await authenticateRaw(raw), true);
    raw.send(tcpHello());
    const id = randomBytes(16);
    raw.send(ncclBufferMessage(id));
    const abort = await ncclAbortFrom(raw);
    assert.equal(abort.id, id.toString('hex'));
    assert.equal(abort.reason, 1);
    assert.match(abort.text, /NCCL/);
    assert.deepEqual(await next(), { error: 'ERR_NCCL_UNAVAILABLE', open: true });
    raw.send(jsonFrame('"after"'));
    assert.deepEqual(await next(), { next: 'after' });
  } finally {
    raw?.destroy();
    if (child.exitCode === null) child.kill();
  }
});
