// NCCL_ABORT frames (PROTOCOL.md 3 and 8.4): on a TCP link, a side that aborted one of the link's
// NCCL communicators says so, so that the peer aborts its end too and fails what it had queued
// on it. The link only carries them: it checks the frame, hands it to the hooks the NCCL layer
// registered on the link (none: it is ignored) and lets that layer send one. What a communicator
// is and what an abort does to transfers is the NCCL layer's business.
//
//   payload = 16-byte communicator id | u32 reason (1..3) | u32 reserved (0) | UTF-8 text (<= 1024 bytes)
import { FrameType, HEADER_BYTES, NCCL_ABORT_HEAD_BYTES, NCCL_ABORT_TEXT_MAX, writeHeader } from '../transport/frame.js';
import { invalidArgType, outOfRange } from '../../arg-errors.js';
import { COMM_ID_BYTES } from './nccl-records.js';

/** @internal Why an NCCL communicator was aborted (PROTOCOL.md 3, NCCL_ABORT). */
export type NcclAbortReason =
  /** The receiver could not take a transfer (no NCCL, no memory, a device it cannot use, a wrong sequence). */
  | 1
  /** NCCL reported an error on the communicator (ncclCommGetAsyncError). */
  | 2
  /** The communicator could not be made. */
  | 3;

/** @internal An NCCL_ABORT frame as received. */
export interface NcclAbort {
  /** The communicator's 16-byte id (a copy). */
  readonly id: Uint8Array;
  readonly reason: NcclAbortReason;
  /** The peer's explanation (UTF-8, at most 1024 bytes on the wire). */
  readonly text: string;
}

/** The longest prefix of `text`'s UTF-8 that fits `max` bytes without cutting a character. */
function utf8Prefix(text: string, max: number): Buffer {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.byteLength <= max) return bytes;
  let end = max;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
}

/** A whole NCCL_ABORT frame; TypeError/RangeError for an id that is not 16 bytes or a reason outside 1..3. */
export function encodeNcclAbort(id: Uint8Array, reason: NcclAbortReason, text: string): Uint8Array {
  if (!(id instanceof Uint8Array) || id.byteLength !== COMM_ID_BYTES) {
    throw invalidArgType(`an NCCL communicator id is a Uint8Array of ${COMM_ID_BYTES} bytes`);
  }
  if (reason !== 1 && reason !== 2 && reason !== 3) throw outOfRange(`an NCCL_ABORT reason is 1, 2 or 3; got ${String(reason)}`);
  if (typeof text !== 'string') throw invalidArgType('an NCCL_ABORT text is a string');
  const body = utf8Prefix(text, NCCL_ABORT_TEXT_MAX);
  const frame = new Uint8Array(HEADER_BYTES + NCCL_ABORT_HEAD_BYTES + body.byteLength);
  const view = new DataView(frame.buffer);
  writeHeader(view, FrameType.NcclAbort, 0, NCCL_ABORT_HEAD_BYTES + body.byteLength, 0);
  frame.set(id, HEADER_BYTES);
  view.setUint32(HEADER_BYTES + 16, reason, true);
  frame.set(body, HEADER_BYTES + NCCL_ABORT_HEAD_BYTES);
  return frame;
}

/** The payload of an NCCL_ABORT frame whose header parseHeader() accepted (length, reason and reserved bytes checked there). */
export function readNcclAbort(buf: Buffer, view: DataView, payloadLength: number): NcclAbort {
  return {
    id: new Uint8Array(buf.subarray(HEADER_BYTES, HEADER_BYTES + COMM_ID_BYTES)),
    reason: view.getUint32(HEADER_BYTES + 16, true) as NcclAbortReason,
    text: buf.toString('utf8', HEADER_BYTES + NCCL_ABORT_HEAD_BYTES, HEADER_BYTES + payloadLength),
  };
}

/** The hooks one link runs for each NCCL_ABORT it receives. */
export class NcclAbortHooks {
  readonly #hooks = new Set<(abort: NcclAbort) => void>();

  /** Adds `hook`; returns a function that removes it. */
  add(hook: (abort: NcclAbort) => void): () => void {
    if (typeof hook !== 'function') throw invalidArgType('an NCCL_ABORT hook is a function');
    this.#hooks.add(hook);
    return () => void this.#hooks.delete(hook);
  }

  /** Runs every hook with `abort` (none: the frame is ignored); a hook that throws is reported, never thrown. */
  run(abort: NcclAbort): void {
    for (const hook of [...this.#hooks]) {
      try {
        hook(abort);
      } catch (e) {
        process.emitWarning(`an NCCL_ABORT hook threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_NCCL_ABORT_HOOK' });
      }
    }
  }

  clear(): void {
    this.#hooks.clear();
  }
}
