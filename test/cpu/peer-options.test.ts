// Peer IPC without a GPU: the refusal where two devices cannot reach each other (through the
// seam that takes the driver's answer), spawn's `device` option as the child sees it, and the
// peer table of `cuda-ipc info`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { assertPeerReachable, WORKING_DEVICE_ENV, type DeviceIdentity } from '../../src/cuda/device.js';
import { formatPeers } from '../../src/cli/info.js';
import { spawn, type Link } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';

const CHILD = new URL('../fixtures/peer-child.js', import.meta.url);
const UUID_A = 'GPU-0a1b2c3d-0000-1111-2222-333344445555';
const UUID_B = 'GPU-ffeeddcc-9999-8888-7777-666655554444';
const gpuA: DeviceIdentity = { ordinal: 0, name: 'Fake GPU A', uuid: UUID_A };
const gpuB: DeviceIdentity = { ordinal: 1, name: 'Fake GPU B', uuid: UUID_B };

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

test('devices that cannot reach each other are refused with ERR_PEER_UNREACHABLE naming both', () => {
  const asked: Array<[number, number]> = [];
  const no = (u: DeviceIdentity, r: DeviceIdentity) => { asked.push([u.ordinal, r.ordinal]); return false; };
  assert.throws(() => assertPeerReachable(gpuB, gpuA, no), (e: unknown) => {
    assert.ok(e instanceof IpcError);
    assert.equal(e.code, 'ERR_PEER_UNREACHABLE');
    assert.match(e.message, /device 1 \(Fake GPU B, GPU-ffeeddcc-9999-8888-7777-666655554444\) cannot use memory that lives on device 0 \(Fake GPU A, GPU-0a1b2c3d-0000-1111-2222-333344445555\)/);
    assert.match(e.message, /spawn\(\{ device \}\)/, 'says what to do instead');
    return true;
  });
  assert.deepEqual(asked, [[1, 0]], 'asked about the user reaching the resident device, in that direction');
  assert.doesNotThrow(() => assertPeerReachable(gpuB, gpuA, () => true));
  // A device always reaches its own memory: the driver is not asked.
  assert.doesNotThrow(() => assertPeerReachable(gpuA, gpuA, no));
  assert.doesNotThrow(() => assertPeerReachable(gpuA, { ...gpuA, ordinal: 3 }, no), 'the same UUID is the same GPU whatever its ordinal');
  assert.equal(asked.length, 1);
});

test('spawn({ device }) gives the child the UUID, normalised; a malformed one is refused before any child starts', async () => {
  const { child, link } = await spawn(CHILD, [], { device: UUID_B.toUpperCase().replace('GPU-', 'gpu-') });
  try {
    assert.deepEqual(await ask(link, { op: 'env' }), { ok: true, device: UUID_B });
  } finally {
    link.send({ op: 'exit' });
    await once(child, 'exit');
  }
  const env = { ...process.env };
  delete env[WORKING_DEVICE_ENV];
  const plain = await spawn(CHILD, [], { env });
  try {
    assert.deepEqual(await ask(plain.link, { op: 'env' }), { ok: true, device: null }, 'no device option, no working device');
  } finally {
    plain.link.send({ op: 'exit' });
    await once(plain.child, 'exit');
  }
  for (const bad of ['1', 'cuda:1', 'GPU-1234', `${UUID_A},${UUID_B}`]) {
    await assert.rejects(spawn(CHILD, [], { device: bad }), (e: unknown) =>
      e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_VALUE' && /spawn options\.device must look like 'GPU-/.test(e.message), bad);
  }
});

test('the peer table of cuda-ipc info: one row per directed pair, and why there are none on one GPU', () => {
  const device = (ordinal: number) => ({ ordinal }) as never;
  assert.deepEqual(formatPeers({ devices: [device(0)], peers: [] }), ['Peer links: none (1 device; peer IPC needs two GPUs)']);
  const lines = formatPeers({
    devices: [device(0), device(1)],
    peers: [
      { from: 0, to: 1, fromUuid: UUID_A, toUuid: UUID_B, accessSupported: true, nativeAtomics: true, performanceRank: 0 },
      { from: 1, to: 0, fromUuid: UUID_B, toUuid: UUID_A, accessSupported: false, nativeAtomics: false, performanceRank: 2 },
    ],
  });
  assert.equal(lines[0], 'Peer links (kernels on "from" using memory of "to"):');
  assert.match(lines[1]!, /^ {2}from {2}to {2}access {2}native atomics {2}performance rank$/);
  assert.match(lines[2]!, /^ {2}0 +1 +yes +yes +0$/);
  assert.match(lines[3]!, /^ {2}1 +0 +no +no +2$/);
});
