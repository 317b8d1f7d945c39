// The token exchange of TCP links (PROTOCOL.md 2.3) at its seam: authenticate() and resolveToken()
// of src/link/transport/tcp-auth.ts, driven byte by byte. The peer is written from the spec
// (test/fixtures/tcp-peer.ts), not from the module. Where the order of bytes matters (a challenge
// cut in pieces, a proof arriving alone or with the peer's first frames) the socket is a small
// stand-in that hands authenticate() exactly the chunks the test gives, which a loopback TCP
// connection may merge; the rest runs on real loopback sockets. Each case checks what a caller
// sees: the error code, which side refuses, the wording that says why, what was written.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { IpcError } from '../../src/errors.js';
import { authenticate, resolveToken, MIN_TOKEN_BYTES, TOKEN_ENV } from '../../src/link/transport/tcp-auth.js';
import { RawTcp, TOKEN, specChallenge, specProof } from '../fixtures/tcp-peer.js';
import { within } from '../helpers/wait.js';

// AuthRole's values (PROTOCOL.md 2.3: 1 connects, 2 listens).
const CONNECTOR = 1;
const LISTENER = 2;

/** A socket that hands authenticate() exactly the chunks a test emits, and keeps what it writes. */
class ChunkSocket extends EventEmitter {
  written: Buffer[] = [];
  paused = true; // as a socket nobody read yet
  write(b: Uint8Array): boolean {
    this.written.push(Buffer.from(b));
    return true;
  }
  pause(): this {
    this.paused = true;
    return this;
  }
  resume(): this {
    this.paused = false;
    return this;
  }
  /** Handlers of the events authenticate() listens to still attached. */
  handlers(): number {
    return ['data', 'end', 'close', 'error'].reduce((n, e) => n + this.listenerCount(e), 0);
  }
}

const asSocket = (s: ChunkSocket): net.Socket => s as unknown as net.Socket;

/** The 48-byte challenge `s` wrote first, checked against PROTOCOL.md 2.3; its nonce. */
function challengeOf(s: ChunkSocket, role: number): Buffer {
  const c = s.written[0]!;
  assert.equal(c.byteLength, 48);
  assert.equal(c.toString('latin1', 0, 4), 'CIPA');
  assert.equal(c[4], 2, 'authentication version 2');
  assert.equal(c[5], role);
  assert.ok(c.subarray(6, 16).every((b) => b === 0), 'reserved bytes zero');
  return c.subarray(16);
}

const code = (want: string, message?: RegExp) => (e: unknown): boolean => {
  assert.ok(e instanceof IpcError, String((e as Error)?.stack ?? e));
  assert.equal(e.code, want, e.message);
  if (message) assert.match(e.message, message);
  return true;
};

// ---- the listening side ----------------------------------------------------------------------------

test('listening side: a challenge in pieces and a proof in pieces are put together; its proof goes out only after the peer\'s checked out; what followed the proof is handed on', async () => {
  const s = new ChunkSocket();
  let challenges = 0;
  const result = authenticate(asSocket(s), LISTENER, Buffer.from(TOKEN), 'peer at test', { onChallenge: () => challenges++ });
  assert.equal(s.paused, false, 'it reads');
  const listenerNonce = challengeOf(s, LISTENER);
  const connectorNonce = randomBytes(32);
  const challenge = specChallenge(CONNECTOR, connectorNonce);
  s.emit('data', challenge.subarray(0, 5));
  s.emit('data', challenge.subarray(5, 20));
  assert.equal(challenges, 0, 'not a challenge yet');
  s.emit('data', challenge.subarray(20));
  assert.equal(challenges, 1, 'the challenge checked out once whole');
  assert.equal(s.written.length, 1, 'no proof of its own before the peer proved the token');
  const proof = specProof(TOKEN, CONNECTOR, listenerNonce, connectorNonce);
  const frames = Buffer.from('the peer\'s first frames');
  s.emit('data', proof.subarray(0, 10));
  s.emit('data', proof.subarray(10, 31));
  // The socket hands chunks over synchronously: what the module did with one is visible at once.
  assert.equal(s.written.length, 1, '31 bytes of a proof are not a proof');
  assert.equal(s.handlers(), 4, 'still listening');
  s.emit('data', Buffer.concat([proof.subarray(31), frames]));
  assert.equal(s.written.length, 2, 'the 32nd byte completes the proof');
  const { leftover } = await within(result, 'the exchange');
  assert.deepEqual(leftover, frames, 'the bytes after the proof are handed on');
  assert.equal(s.written.length, 2);
  assert.deepEqual(s.written[1], specProof(TOKEN, LISTENER, listenerNonce, connectorNonce), 'its proof, with its own role byte');
  assert.equal(s.paused, true, 'paused for the Link, which reads the rest');
  assert.equal(s.handlers(), 0, 'its handlers are gone: the Link owns the socket now');
  assert.equal(challenges, 1);
});

test('listening side: a challenge of exactly 48 bytes and a proof of exactly 32, each alone, complete the exchange; nothing followed, so nothing is handed on', async () => {
  const s = new ChunkSocket();
  let challenges = 0;
  const result = authenticate(asSocket(s), LISTENER, Buffer.from(TOKEN), 'peer at test', { onChallenge: () => challenges++ });
  const listenerNonce = challengeOf(s, LISTENER);
  const connectorNonce = randomBytes(32);
  s.emit('data', specChallenge(CONNECTOR, connectorNonce));
  assert.equal(challenges, 1, 'a whole challenge is read as one');
  s.emit('data', specProof(TOKEN, CONNECTOR, listenerNonce, connectorNonce));
  assert.equal(s.handlers(), 0, 'a proof of exactly 32 bytes ends the exchange');
  const { leftover } = await within(result, 'the exchange');
  assert.equal(leftover, undefined);
  assert.deepEqual(s.written[1], specProof(TOKEN, LISTENER, listenerNonce, connectorNonce));
});

test('listening side: a wrong proof is ERR_AUTH_FAILED and its own proof is never sent; a peer that closes after its challenge is refused, one that sent nothing is a silent probe', async () => {
  {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), LISTENER, Buffer.from(TOKEN), 'peer at test');
    const listenerNonce = challengeOf(s, LISTENER);
    const connectorNonce = randomBytes(32);
    s.emit('data', Buffer.concat([specChallenge(CONNECTOR, connectorNonce), specProof('another-token-of-enough-bytes', CONNECTOR, listenerNonce, connectorNonce)]));
    await assert.rejects(p, code('ERR_AUTH_FAILED', /^the peer at test did not prove the token: the two sides hold different tokens/));
    assert.equal(s.written.length, 1, 'only its challenge went out');
    assert.equal(s.handlers(), 0);
  }
  for (const event of ['end', 'close'] as const) {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), LISTENER, Buffer.from(TOKEN), 'peer at test');
    s.emit('data', specChallenge(CONNECTOR, randomBytes(32)));
    s.emit(event);
    await assert.rejects(p, (e: unknown) => {
      code('ERR_AUTH_FAILED', /^the peer at test closed the connection before it proved the token$/)(e);
      assert.equal((e as { silent?: boolean }).silent, undefined, `${event}: it said something, so it is reported`);
      return true;
    });
    assert.equal(s.written.length, 1);
  }
  {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), LISTENER, Buffer.from(TOKEN), 'peer at test');
    const reset = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    s.emit('error', reset);
    await assert.rejects(p, (e: unknown) => {
      code('ERR_AUTH_FAILED', /^the peer at test reset the connection \(read ECONNRESET\) before it proved the token$/)(e);
      assert.equal((e as IpcError).cause, reset);
      assert.equal((e as { silent?: boolean }).silent, true, 'it sent nothing: a probe, not an attempt');
      return true;
    });
  }
});

// ---- the connecting side ---------------------------------------------------------------------------

test('connecting side: proves first, as soon as the listener\'s challenge is whole, then checks the listener\'s proof; the listener\'s first frames after it are handed on', async () => {
  const s = new ChunkSocket();
  const result = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
  const connectorNonce = challengeOf(s, CONNECTOR);
  const listenerNonce = randomBytes(32);
  const challenge = specChallenge(LISTENER, listenerNonce);
  s.emit('data', challenge.subarray(0, 47));
  assert.equal(s.written.length, 1, 'no proof before the challenge is whole');
  s.emit('data', challenge.subarray(47));
  assert.equal(s.written.length, 2, 'its proof at once, without waiting for the listener\'s');
  assert.deepEqual(s.written[1], specProof(TOKEN, CONNECTOR, listenerNonce, connectorNonce));
  const hello = Buffer.from('HELLO and more');
  s.emit('data', Buffer.concat([specProof(TOKEN, LISTENER, listenerNonce, connectorNonce), hello]));
  const { leftover } = await within(result, 'the exchange');
  assert.deepEqual(leftover, hello);
  assert.equal(s.paused, true);
  assert.equal(s.handlers(), 0);
});

test('connecting side: closed before it proved anything is ERR_LISTENER_BUSY (worth another try); closed after its proof is ERR_AUTH_FAILED (the tokens differ)', async () => {
  {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
    s.emit('close');
    await assert.rejects(p, (e: unknown) => {
      code('ERR_LISTENER_BUSY', /^the listener at test closed the connection before this side could prove the token: it is at its bound/)(e);
      assert.equal((e as { silent?: boolean }).silent, true);
      return true;
    });
  }
  {
    // Its challenge came, cut short: still nothing proved.
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
    s.emit('data', specChallenge(LISTENER, randomBytes(32)).subarray(0, 30));
    const reset = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    s.emit('error', reset);
    await assert.rejects(p, (e: unknown) => {
      code('ERR_LISTENER_BUSY', /^the listener at test reset the connection \(read ECONNRESET\) before this side could prove the token/)(e);
      assert.equal((e as IpcError).cause, reset);
      assert.equal((e as { silent?: boolean }).silent, undefined, 'it got bytes');
      return true;
    });
  }
  {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
    s.emit('data', specChallenge(LISTENER, randomBytes(32)));
    assert.equal(s.written.length, 2, 'its proof went out');
    s.emit('end');
    await assert.rejects(p, code('ERR_AUTH_FAILED', /^the listener at test did not prove the token: the two sides hold different tokens \(options\.token or CUDA_IPC_TOKEN\): it closed the connection after this side's proof, without its own$/));
  }
  {
    // Reset after its proof: the same refusal, with the reset as its cause.
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
    s.emit('data', specChallenge(LISTENER, randomBytes(32)));
    const reset = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    s.emit('error', reset);
    await assert.rejects(p, (e: unknown) => {
      code('ERR_AUTH_FAILED', /: it reset the connection \(read ECONNRESET\) after this side's proof, without its own$/)(e);
      assert.equal((e as IpcError).cause, reset);
      return true;
    });
  }
  {
    // An error without a code (a stream destroyed with a plain Error) is no want of room either way: not a TLS alert.
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
    s.emit('error', new Error('gone'));
    await assert.rejects(p, code('ERR_LISTENER_BUSY', /reset the connection \(gone\)/));
  }
});

test('connecting side: a TLS alert during the exchange (the listener refused this side\'s certificate) is ERR_AUTH_FAILED with the alert as its cause, not a busy listener', async () => {
  const s = new ChunkSocket();
  const p = authenticate(asSocket(s), CONNECTOR, Buffer.from(TOKEN), 'listener at test');
  const alert = Object.assign(new Error('tlsv13 alert certificate required'), { code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' });
  s.emit('error', alert);
  await assert.rejects(p, (e: unknown) => {
    code('ERR_AUTH_FAILED', /^TLS with the listener at test failed during authentication: tlsv13 alert certificate required$/)(e);
    assert.equal((e as IpcError).cause, alert);
    return true;
  });
});

// ---- challenges --------------------------------------------------------------------------------

test('a malformed challenge is ERR_FRAME_INVALID saying what is wrong with it, on either side, and nothing is proved to it', async () => {
  const cases: Array<{ role: number; challenge: Buffer; why: RegExp }> = [
    { role: LISTENER, challenge: specChallenge(CONNECTOR, randomBytes(32), (b) => (b[6] = 1)), why: /: its reserved bytes are not zero; the connection was closed$/ },
    { role: LISTENER, challenge: specChallenge(CONNECTOR, randomBytes(32), (b) => (b[7] = 0x80)), why: /: its reserved bytes are not zero;/ },
    { role: CONNECTOR, challenge: specChallenge(LISTENER, randomBytes(32), (b) => (b[15] = 1)), why: /: its reserved bytes are not zero;/ },
    { role: LISTENER, challenge: specChallenge(CONNECTOR, randomBytes(32), (b) => (b[4] = 3)), why: /: it speaks authentication version 3, this build 2; the connection was closed$/ },
    { role: CONNECTOR, challenge: specChallenge(LISTENER, randomBytes(32), (b) => (b[4] = 1)), why: /: it speaks authentication version 1, this build 2 \(version 1, where both sides proved at once, is no longer spoken: update the older side\);/ },
    { role: LISTENER, challenge: specChallenge(LISTENER, randomBytes(32)), why: /: it claims role 2, not 1 \(the connecting side\);/ },
    { role: CONNECTOR, challenge: specChallenge(CONNECTOR, randomBytes(32)), why: /: it claims role 1, not 2 \(the listening side\);/ },
    { role: CONNECTOR, challenge: specChallenge(LISTENER, randomBytes(32), (b) => b.write('HTTP', 0, 'latin1')), why: /: its first bytes are not a cuda-ipc challenge/ },
  ];
  for (const c of cases) {
    const s = new ChunkSocket();
    const p = authenticate(asSocket(s), c.role, Buffer.from(TOKEN), 'peer at test');
    s.emit('data', c.challenge);
    await assert.rejects(p, code('ERR_FRAME_INVALID', new RegExp(`^the peer at test sent an invalid authentication challenge${c.why.source}`)));
    assert.equal(s.written.length, 1, 'its challenge and no proof');
    assert.equal(s.handlers(), 0);
  }
});

// ---- on a real socket -------------------------------------------------------------------------------

test('on loopback TCP: a socket its caller paused is read all the same, and both sides agree', async () => {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = once(server, 'connection');
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await once(client, 'connect');
  const [socket] = (await accepted) as [net.Socket];
  server.close();
  try {
    socket.pause();
    client.pause();
    const [l, c] = await within(Promise.all([
      authenticate(socket, LISTENER, Buffer.from(TOKEN), 'peer'),
      authenticate(client, CONNECTOR, Buffer.from(TOKEN), 'listener'),
    ]), 'both sides of the exchange');
    // What follows is the Link's: paused, and every byte written after the proofs arrives.
    assert.equal(socket.isPaused(), true);
    client.write('after');
    const [got] = (await within(once(socket.resume(), 'data'), 'the bytes after the proofs')) as [Buffer];
    assert.equal(Buffer.concat([l.leftover ?? Buffer.alloc(0), got]).toString(), 'after');
    assert.equal(c.leftover, undefined);
  } finally {
    socket.destroy();
    client.destroy();
  }
});

test('on loopback TCP: a raw peer from the spec and authenticate() as the listener; the peer\'s proof and its first frames in one write', async () => {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = once(server, 'connection');
  const raw = await RawTcp.connect((server.address() as net.AddressInfo).port);
  const [socket] = (await accepted) as [net.Socket];
  server.close();
  try {
    const result = authenticate(socket, LISTENER, Buffer.from(TOKEN), 'peer');
    const nonce = randomBytes(32);
    raw.send(specChallenge(CONNECTOR, nonce));
    const theirs = await raw.take(48);
    raw.send(Buffer.concat([specProof(TOKEN, CONNECTOR, theirs.subarray(16), nonce), Buffer.from('frames')]));
    const { leftover } = await within(result, 'the exchange');
    assert.deepEqual(await raw.take(32), specProof(TOKEN, LISTENER, theirs.subarray(16), nonce));
    // 'frames' came with the proof or just after it: what was not handed on is still in the socket.
    let rest = leftover ?? Buffer.alloc(0);
    if (rest.byteLength < 6) rest = Buffer.concat([rest, ...((await within(once(socket.resume(), 'data'), 'the rest')) as Buffer[])]);
    assert.equal(rest.toString(), 'frames');
  } finally {
    socket.destroy();
    raw.destroy();
  }
});

// ---- tokens ---------------------------------------------------------------------------------------

test('resolveToken: the option (a string as UTF-8, or bytes, copied) before CUDA_IPC_TOKEN; 16 bytes is enough, 15 is ERR_AUTH_FAILED; an empty variable is no token; another type is a TypeError', () => {
  const saved = process.env[TOKEN_ENV];
  try {
    process.env[TOKEN_ENV] = 'from-the-environment-0123';
    assert.equal(MIN_TOKEN_BYTES, 16);
    assert.deepEqual(resolveToken('x'.repeat(16), 'connect'), Buffer.from('x'.repeat(16)));
    assert.deepEqual(resolveToken('é'.repeat(8), 'connect'), Buffer.from('é'.repeat(8), 'utf8'), '8 characters, 16 bytes of UTF-8');
    const bytes = new Uint8Array(16).fill(7);
    const got = resolveToken(bytes, 'connect');
    assert.deepEqual([...got], [...bytes]);
    bytes[0] = 0;
    assert.equal(got[0], 7, 'a copy: the caller may reuse its bytes');
    assert.throws(() => resolveToken('x'.repeat(15), 'listen'), code('ERR_AUTH_FAILED', /^listen: the token \(options\.token\) is 15 bytes; a token is at least 16 bytes/));
    assert.throws(() => resolveToken(new Uint8Array(15), 'listen'), code('ERR_AUTH_FAILED', /\(options\.token\) is 15 bytes/));
    assert.deepEqual(resolveToken(undefined, 'connect'), Buffer.from('from-the-environment-0123'));
    process.env[TOKEN_ENV] = 'y'.repeat(16);
    assert.deepEqual(resolveToken(undefined, 'connect'), Buffer.from('y'.repeat(16)));
    process.env[TOKEN_ENV] = '';
    assert.throws(() => resolveToken(undefined, 'connect'), code('ERR_AUTH_FAILED', /^connect: a TCP link needs a token and none was given: pass \{ token \} or set CUDA_IPC_TOKEN/));
    for (const bad of [42, null, { length: 16 }, ['x'.repeat(16)]]) {
      assert.throws(() => resolveToken(bad, 'connect'), (e: unknown) => {
        assert.ok(e instanceof TypeError);
        assert.equal((e as { code?: string }).code, 'ERR_INVALID_ARG_TYPE');
        assert.equal(e.message, 'connect: options.token must be a string or a Uint8Array');
        return true;
      }, String(bad));
    }
  } finally {
    if (saved === undefined) delete process.env[TOKEN_ENV];
    else process.env[TOKEN_ENV] = saved;
  }
});
