// Messages larger than a frame (PROTOCOL.md 3.1): the whole payload travels in a memfd sealed
// against any change, attached as the frame's first fd; the frame itself carries the payload's
// length. The receiver checks the seals and the size before reading, so a peer can neither lie
// about the length nor change the bytes while they are decoded, and reading (pread, no mapping)
// can never fault.
import { IpcError, fdLimitError, outOfMemoryError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { MAX_PAYLOAD_BYTES, invalid } from './frame.js';
import { closeFd } from './fds.js';

const { F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, F_SEAL_SEAL } = addon.posixConstants;
/** Seals a large message's memfd must carry: its size and its bytes are fixed. */
export const LARGE_PAYLOAD_SEALS = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

/** Default largest message (payload bytes) a link sends or accepts: 256 MiB, the default inbox bound (link-options.ts). */
export const DEFAULT_MAX_MESSAGE_BYTES = 256 * 2 ** 20;

/** Writes `bytes` whole at `offset` of `fd`. */
function writeAll(fd: number, bytes: Uint8Array, offset: number): void {
  let at = 0;
  while (at < bytes.byteLength) at += addon.pwrite(fd, bytes.subarray(at), offset + at);
}

/**
 * A new memfd holding head[start, end) followed by `body`, sealed (LARGE_PAYLOAD_SEALS and
 * F_SEAL_SEAL). The caller owns the fd. Running out of fds is ERR_FD_LIMIT.
 */
export function writeLargePayload(head: Uint8Array, start: number, end: number, body: Uint8Array | null): number {
  let fd: number;
  try {
    fd = addon.memfdCreate('cuda-ipc-message');
  } catch (e) {
    throw fdLimitError(e, 'link.send (a large message needs a memfd)');
  }
  try {
    writeAll(fd, head.subarray(start, end), 0);
    if (body) writeAll(fd, body, end - start);
    addon.addSeals(fd, LARGE_PAYLOAD_SEALS | F_SEAL_SEAL);
    return fd;
  } catch (e) {
    closeFd(fd);
    throw e;
  }
}

/**
 * The `length`-byte payload of a received large message from its memfd `fd` (not closed here).
 * Throws ERR_FRAME_INVALID when the fd is not a memfd sealed with LARGE_PAYLOAD_SEALS, or its
 * size is not `length`.
 */
export function readLargePayload(fd: number, length: number): Buffer {
  let seals: number;
  try {
    seals = addon.getSeals(fd);
  } catch {
    throw invalid(`the payload fd of a large message is not a memfd (a ${addon.fileKind(fd)})`);
  }
  if ((seals & LARGE_PAYLOAD_SEALS) !== LARGE_PAYLOAD_SEALS) {
    throw invalid('the memfd of a large message is not sealed against writing, shrinking and growing');
  }
  const size = addon.fstatSize(fd);
  if (size !== length) throw invalid(`a large message announces ${length} bytes but its memfd holds ${size}`);
  let payload: Buffer;
  try {
    payload = Buffer.allocUnsafe(length);
  } catch (e) {
    throw outOfMemoryError(e, 'receiving a large message', length);
  }
  let at = 0;
  while (at < length) {
    const n = addon.pread(fd, payload.subarray(at), at);
    if (n === 0) throw invalid(`the memfd of a large message ended after ${at} of ${length} bytes`);
    at += n;
  }
  return payload;
}

/** Checks the declared length of a large message against the rules and `limit`. */
export function checkLargeLength(length: number, limit: number): void {
  if (length < 0) throw invalid('a large message announces more than 2^53 bytes');
  if (length <= MAX_PAYLOAD_BYTES) throw invalid(`a large message of ${length} bytes would have fit in a frame`);
  checkMessageLength(length, limit);
}

/** A received message's payload length against the link's maxMessageBytes. */
export function checkMessageLength(length: number, limit: number): void {
  if (length > limit) {
    throw new IpcError(
      'ERR_MESSAGE_TOO_LARGE',
      `the peer sent a message of ${length} bytes, more than this link accepts (maxMessageBytes ${limit}); the link was closed`,
      { limit: 'maxMessageBytes' },
    );
  }
}
