// Authentication of TCP links (PROTOCOL.md 2.3): both sides hold a shared token (at least 16
// bytes; an option, else CUDA_IPC_TOKEN) and prove it with an HMAC over both sides' random
// nonces before any frame. The connecting side proves first; the listener sends its own proof
// only to a peer whose proof checked out, so a connection that sends a challenge and no proof
// (or a wrong one) learns nothing it could test guesses of the token against. The token never
// crosses the wire; proofs are compared in constant time; the two proofs differ in their role
// byte, so a proof sent back to its sender fails, and so do tokens that differ, on both sides.
//
//   challenge (48 bytes) = u32 magic 'CIPA' | u8 version 2 | u8 role (1 connects, 2 listens)
//                          | u16 reserved 0 | 8 reserved bytes 0 | 32-byte nonce
//   proof (32 bytes)     = HMAC-SHA256(token, "cuda-ipc tcp auth v1" | u8 prover's role
//                          | listener's nonce | connector's nonce)
//
// Version 2 is the order (version 1 had both sides prove at once); the proof itself is unchanged.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Socket } from 'node:net';
import { IpcError } from '../../errors.js';
import { invalidArgType } from '../../arg-errors.js';

/** The environment variable a token comes from when no `token` option is given. */
export const TOKEN_ENV = 'CUDA_IPC_TOKEN';
/** The shortest token accepted, in bytes. */
export const MIN_TOKEN_BYTES = 16;

const CHALLENGE_MAGIC = 0x41504943; // 'CIPA'
/** 2: the connecting side proves first (1: both at once; refused, with both versions named). */
export const AUTH_VERSION = 2;
const CHALLENGE_BYTES = 48;
const NONCE_BYTES = 32;
const PROOF_BYTES = 32;
const LABEL = Buffer.from('cuda-ipc tcp auth v1', 'latin1');

export const enum AuthRole {
  Connector = 1,
  Listener = 2,
}

/**
 * The token of a TCP link: `option` (a string, as UTF-8, or bytes), else CUDA_IPC_TOKEN. None, or
 * one shorter than 16 bytes, is ERR_AUTH_FAILED: nothing is sent without one.
 */
export function resolveToken(option: unknown, what: string): Buffer {
  let token: Buffer;
  let from: string;
  if (option !== undefined) {
    if (typeof option === 'string') token = Buffer.from(option, 'utf8');
    else if (option instanceof Uint8Array) token = Buffer.from(option);
    else throw invalidArgType(`${what}: options.token must be a string or a Uint8Array`);
    from = 'options.token';
  } else {
    const env = process.env[TOKEN_ENV];
    if (env === undefined || env === '') {
      throw new IpcError(
        'ERR_AUTH_FAILED',
        `${what}: a TCP link needs a token and none was given: pass { token } or set ${TOKEN_ENV}, the same secret on both sides ` +
          `(at least ${MIN_TOKEN_BYTES} bytes; \`cuda-ipc token\` prints a fresh one). Nothing was sent`,
      );
    }
    token = Buffer.from(env, 'utf8');
    from = TOKEN_ENV;
  }
  if (token.byteLength < MIN_TOKEN_BYTES) {
    throw new IpcError('ERR_AUTH_FAILED', `${what}: the token (${from}) is ${token.byteLength} bytes; a token is at least ${MIN_TOKEN_BYTES} bytes (\`cuda-ipc token\` prints a fresh one). Nothing was sent`);
  }
  return token;
}

/** A 48-byte challenge of `role` with `nonce`. */
function encodeChallenge(role: AuthRole, nonce: Uint8Array): Buffer {
  const c = Buffer.alloc(CHALLENGE_BYTES);
  c.writeUInt32LE(CHALLENGE_MAGIC, 0);
  c[4] = AUTH_VERSION;
  c[5] = role;
  c.set(nonce, 16);
  return c;
}

/** The proof a side of `role` sends (or should have sent): PROTOCOL.md 2.3 step 2. */
function authProof(token: Uint8Array, role: AuthRole, listenerNonce: Uint8Array, connectorNonce: Uint8Array): Buffer {
  return createHmac('sha256', token).update(LABEL).update(Buffer.of(role)).update(listenerNonce).update(connectorNonce).digest();
}

/** The peer's nonce from its challenge; ERR_FRAME_INVALID for anything but a challenge of `peerRole`. */
function readChallenge(c: Buffer, peerRole: AuthRole, peerName: string): Buffer {
  const why =
    c.readUInt32LE(0) !== CHALLENGE_MAGIC ? 'its first bytes are not a cuda-ipc challenge (is it a cuda-ipc TCP link at all?)'
    : c[4] !== AUTH_VERSION ? `it speaks authentication version ${c[4]}, this build ${AUTH_VERSION}${c[4] === 1 ? ' (version 1, where both sides proved at once, is no longer spoken: update the older side)' : ''}`
    : c[5] !== peerRole ? `it claims role ${c[5]}, not ${peerRole} (${peerRole === AuthRole.Listener ? 'the listening side' : 'the connecting side'})`
    : c.readUInt16LE(6) !== 0 || c.readBigUInt64LE(8) !== 0n ? 'its reserved bytes are not zero'
    : undefined;
  if (why) throw new IpcError('ERR_FRAME_INVALID', `the ${peerName} sent an invalid authentication challenge: ${why}; the connection was closed`);
  return Buffer.from(c.subarray(16, 16 + NONCE_BYTES));
}


/** What authenticate() resolves with. */
export interface Authenticated {
  /** Bytes the peer sent after its proof (its first frames), to be read as frames. */
  leftover: Buffer | undefined;
}

/** What authenticate() may tell its caller as the exchange goes. */
export interface AuthProgress {
  /** The peer's challenge arrived and checked out (the listener's short challenge deadline ends). */
  onChallenge?: () => void;
}

/**
 * Runs the exchange on `socket` (connected, not yet read) as `role`: sends this side's challenge;
 * the connecting side answers the listener's challenge with its proof and then checks the
 * listener's; the listening side checks the connecting side's proof and only then sends its own.
 * Resolves once the peer proved the token (and a listener's proof is written), with the socket
 * paused and what followed the peer's proof; rejects with ERR_AUTH_FAILED (a wrong proof; the
 * connection ended after this side's proof), ERR_FRAME_INVALID (a malformed challenge) or, on the
 * connecting side, ERR_LISTENER_BUSY when the listener closed the connection before this side
 * could prove anything (a listener at its bound of pending connections does so; worth another
 * try). Leaves closing the socket to the caller. `silent` is set on the error when the peer sent
 * nothing at all (a port probe, not an attempt).
 */
export function authenticate(socket: Socket, role: AuthRole, token: Uint8Array, peerName: string, progress: AuthProgress = {}): Promise<Authenticated> {
  const peerRole = role === AuthRole.Connector ? AuthRole.Listener : AuthRole.Connector;
  const nonce = randomBytes(NONCE_BYTES);
  return new Promise<Authenticated>((resolve, reject) => {
    let got: Buffer = Buffer.alloc(0);
    let received = 0;
    let expected: Buffer | undefined; // the peer's proof, once its challenge came
    let mine: Buffer | undefined; // this side's proof, once the peer's challenge came
    let proved = false; // this side's proof went out
    let done = false;
    const finish = (error: IpcError | undefined, leftover?: Buffer): void => {
      if (done) return;
      done = true;
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('close', onEnd);
      socket.off('error', onError);
      if (error) {
        reject(error);
        return;
      }
      socket.pause();
      resolve({ leftover: leftover?.byteLength ? leftover : undefined });
    };
    const onData = (chunk: Buffer): void => {
      received += chunk.byteLength;
      got = got.byteLength ? Buffer.concat([got, chunk]) : chunk;
      try {
        if (!expected) {
          if (got.byteLength < CHALLENGE_BYTES) return;
          const peerNonce = readChallenge(got, peerRole, peerName);
          got = got.subarray(CHALLENGE_BYTES);
          const [listenerNonce, connectorNonce] = role === AuthRole.Listener ? [nonce, peerNonce] : [peerNonce, nonce];
          mine = authProof(token, role, listenerNonce, connectorNonce);
          expected = authProof(token, peerRole, listenerNonce, connectorNonce);
          // The connecting side proves first; the listener keeps its proof until the peer's checked out.
          if (role === AuthRole.Connector) {
            socket.write(mine);
            proved = true;
          }
          progress.onChallenge?.();
        }
        if (got.byteLength < PROOF_BYTES) return;
        if (!timingSafeEqual(got.subarray(0, PROOF_BYTES), expected)) {
          throw new IpcError(
            'ERR_AUTH_FAILED',
            `the ${peerName} did not prove the token: the two sides hold different tokens (options.token or ${TOKEN_ENV}); the connection was closed before any message was read`,
          );
        }
        if (role === AuthRole.Listener) {
          socket.write(mine!);
          proved = true;
        }
        finish(undefined, Buffer.from(got.subarray(PROOF_BYTES)));
      } catch (e) {
        finish(e as IpcError);
      }
    };
    const ended = (how: string, cause?: Error): IpcError => {
      let error: IpcError;
      if (role === AuthRole.Connector && !proved) {
        error = new IpcError(
          'ERR_LISTENER_BUSY',
          `the ${peerName} ${how} before this side could prove the token: it is at its bound of connections still authenticating (maxPending, or its bound per address), or it is not a cuda-ipc listener`,
          { cause },
        );
      } else if (role === AuthRole.Connector) {
        error = new IpcError(
          'ERR_AUTH_FAILED',
          `the ${peerName} did not prove the token: the two sides hold different tokens (options.token or ${TOKEN_ENV}): it ${how} after this side's proof, without its own`,
          { cause },
        );
      } else {
        error = new IpcError('ERR_AUTH_FAILED', `the ${peerName} ${how} before it proved the token`, { cause });
      }
      if (received === 0) Object.assign(error, { silent: true });
      return error;
    };
    const onEnd = (): void => finish(ended('closed the connection'));
    const onError = (e: Error & { code?: string }): void => {
      // A TLS alert (a listener refusing this side's certificate: TLS 1.3 says so only after the handshake) is no want of room.
      if (e.code?.startsWith('ERR_SSL')) finish(new IpcError('ERR_AUTH_FAILED', `TLS with the ${peerName} failed during authentication: ${e.message}`, { cause: e }));
      else finish(ended(`reset the connection (${e.message})`, e));
    };
    socket.on('data', onData);
    socket.on('end', onEnd);
    socket.on('close', onEnd);
    socket.on('error', onError);
    socket.write(encodeChallenge(role, nonce));
    socket.resume();
  });
}
