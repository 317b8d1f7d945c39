// Typed errors. CudaError mirrors a failed driver call; IpcError carries a stable `code` that
// programs can switch on, and a message that says what went wrong and what to do instead.
import { constants as bufferConstants } from 'node:buffer';

/** A CUDA driver call failed. `code` is the driver's name for the status. */
export class CudaError extends Error {
  override name = 'CudaError';
  /** The driver's code name, e.g. `CUDA_ERROR_INVALID_VALUE` (or `CUDA_DRIVER_NOT_FOUND`). */
  readonly code: string;
  /** The CUresult number (-1 when the driver library itself could not be loaded). */
  readonly status: number;
  /** The driver function that failed, e.g. `cuIpcOpenMemHandle`. */
  readonly call: string;
  /** The driver's own description of the status. */
  readonly description: string;

  constructor(status: number, code: string, description: string, call: string, hint?: string) {
    super(`${call} failed: ${code} (${status}): ${description}${hint ? `. ${hint}` : ''}`);
    this.status = status;
    this.code = code;
    this.description = description;
    this.call = call;
  }
}

/** The stable `code` of an IpcError; programs may switch on it. */
export type IpcErrorCode =
  // descriptors and wire formats
  | 'ERR_DESCRIPTOR_INVALID'
  | 'ERR_DESCRIPTOR_VERSION'
  | 'ERR_DESCRIPTOR_KIND'
  // sharing
  | 'ERR_NOT_EXPORTABLE'
  | 'ERR_HANDLE_STALE'
  | 'ERR_UNKNOWN_DEVICE'
  | 'ERR_PEER_UNREACHABLE'
  | 'ERR_OUT_OF_RANGE'
  | 'ERR_CLOSED'
  | 'ERR_IMPORTED_POOL'
  | 'ERR_UNSUPPORTED'
  | 'ERR_INVALID_STATE'
  | 'ERR_TIMEOUT'
  | 'ERR_COMPILE'
  // memory: too much for this machine (ENOMEM), or for one typed array of this Node.js
  | 'ERR_OUT_OF_MEMORY'
  | 'ERR_VIEW_TOO_LARGE'
  // installation: no native addon fits this machine (build it with `npm rebuild cuda-ipc`)
  | 'ERR_NO_NATIVE_BUILD'
  // links
  | 'ERR_PEER_GONE'
  | 'ERR_PEER_REFUSED'
  | 'ERR_LINK_CLOSED'
  | 'ERR_FRAME_INVALID'
  | 'ERR_MESSAGE_TOO_LARGE'
  | 'ERR_FDS_TRUNCATED'
  | 'ERR_SEND_QUEUE_FULL'
  | 'ERR_LIMIT_REACHED'
  | 'ERR_FD_LIMIT'
  | 'ERR_NOT_TRANSFERABLE'
  | 'ERR_NO_LISTENER'
  | 'ERR_ADDRESS_IN_USE'
  | 'ERR_LISTENER_BUSY'
  | 'ERR_SOCKET_DIR_UNSAFE'
  | 'ERR_NOT_SPAWNED'
  // files in shared places: a name that is not a regular file, or too large (src/safe-files.ts)
  | 'ERR_FILE_UNSAFE'
  // TCP links: the peer did not prove the shared token (or there is none to prove)
  | 'ERR_AUTH_FAILED'
  // channels
  | 'ERR_CHANNEL_CLOSED'
  | 'ERR_CHANNEL_CORRUPT'
  // tensors (src/tensors)
  | 'ERR_TENSOR_MISMATCH'
  | 'ERR_SAFETENSORS_INVALID'
  // sharded layouts and their plan (src/tensors/sharded): refused before anything moves
  | 'ERR_LAYOUT_INVALID'
  | 'ERR_LAYOUT_BOUNDS'
  | 'ERR_LAYOUT_DTYPE'
  | 'ERR_LAYOUT_SHAPE'
  | 'ERR_LAYOUT_UNCOVERED'
  | 'ERR_LAYOUT_OVERLAP'
  // sharded sync groups (src/tensors/sharded): a control message that breaks the group's wire; a
  // rank lost mid-sync (its link dropped, it died); ranks that planned differently; a rank whose
  // memories are not all host or all on its GPU; this rank's copy failed (the driver's error is
  // the cause); a data path this build does not have yet
  | 'ERR_SHARD_PROTOCOL'
  | 'ERR_SHARD_PEER_LOST'
  | 'ERR_SHARD_PLAN'
  | 'ERR_SHARD_MEMORY'
  | 'ERR_SHARD_COPY'
  | 'ERR_NOT_IMPLEMENTED'
  // NCCL (src/nccl): no usable libnccl.so.2 was found; an NCCL call failed (see NcclError);
  // device memory on a tls:// link would cross NCCL's network in clear (LinkOptions.allowNcclInClear)
  | 'ERR_NCCL_UNAVAILABLE'
  | 'ERR_NCCL'
  | 'ERR_NCCL_UNENCRYPTED';

/** A cuda-ipc usage or protocol error with a stable `code`. */
export class IpcError extends Error {
  override name = 'IpcError';
  readonly code: IpcErrorCode;
  /**
   * The option that bounds what ran out, for errors that say a limit was reached
   * (ERR_MESSAGE_TOO_LARGE, ERR_SEND_QUEUE_FULL, ERR_LIMIT_REACHED), e.g. 'maxMessageBytes'.
   */
  readonly limit?: string;
  constructor(code: IpcErrorCode, message: string, options?: { cause?: unknown; limit?: string }) {
    super(message, options);
    this.code = code;
    if (options?.limit !== undefined) this.limit = options.limit;
  }
}

/** Errno codes that mean this process (or the system) has no fd to spare. */
const FD_EXHAUSTED = new Set(['EMFILE', 'ENFILE', 'ETOOMANYREFS']);

/** Whether `e` says no file descriptor was available (EMFILE, ENFILE, ETOOMANYREFS). */
export function fdsExhausted(e: unknown): boolean {
  const code = (e as { code?: unknown })?.code;
  return typeof code === 'string' && FD_EXHAUSTED.has(code);
}

/**
 * `e` as the error the user sees from `what` (e.g. 'HostBuffer.allocate'): running out of file
 * descriptors (EMFILE, ENFILE, ETOOMANYREFS) becomes an IpcError ERR_FD_LIMIT that says so;
 * anything else is returned unchanged.
 */
export function fdLimitError(e: unknown, what: string): unknown {
  if (!fdsExhausted(e)) return e;
  const code = (e as { code: string }).code;
  const why =
    code === 'EMFILE' ? 'this process has as many files open as its limit allows (EMFILE; see `ulimit -n`)'
    : code === 'ENFILE' ? 'the system has as many files open as it allows (ENFILE)'
    : 'too many file descriptors are in flight to peers that have not read them yet (ETOOMANYREFS)';
  return new IpcError('ERR_FD_LIMIT', `${what}: no file descriptor available: ${why}; close buffers, links or channels you no longer need, or raise the limit`, { cause: e });
}

/**
 * The most bytes one typed array (or Buffer) can span in this Node.js: `buffer.constants.MAX_LENGTH`,
 * 2^32 on Node 20 and 2^53 - 1 from Node 22. Memory larger than this is still served (mapped,
 * copied, sent); only a single JavaScript view of all of it cannot be made.
 */
export const MAX_VIEW_BYTES: number = bufferConstants.MAX_LENGTH;

/**
 * Throws IpcError ERR_VIEW_TOO_LARGE when `bytes` do not fit in one typed array here; `what` names
 * the call, `instead` says what to use (a smaller view, copies in pieces).
 */
export function checkViewBytes(bytes: number, what: string, instead: string): void {
  if (bytes > MAX_VIEW_BYTES) {
    throw new IpcError('ERR_VIEW_TOO_LARGE',
      `${what}: ${bytes} bytes are more than one typed array can hold in this Node.js (${MAX_VIEW_BYTES} bytes, buffer.constants.MAX_LENGTH); ${instead}`);
  }
}

/**
 * `e` as the error the user sees when `what` could not get `bytes` of memory: ENOMEM (from mmap,
 * memfd, or a typed array V8 could not allocate) becomes IpcError ERR_OUT_OF_MEMORY naming the size;
 * CUDA_ERROR_OUT_OF_MEMORY stays a CudaError and says the size too; anything else is unchanged.
 */
export function outOfMemoryError(e: unknown, what: string, bytes: number): unknown {
  if (e instanceof CudaError) {
    if (e.code !== 'CUDA_ERROR_OUT_OF_MEMORY') return e;
    return new CudaError(e.status, e.code, e.description, e.call, `${what} asked for ${bytes} bytes`);
  }
  const code = (e as { code?: unknown })?.code;
  const v8Refused = e instanceof RangeError && /allocation failed/i.test(e.message);
  if (code !== 'ENOMEM' && !v8Refused) return e;
  return new IpcError('ERR_OUT_OF_MEMORY',
    `${what}: cannot get ${bytes} bytes of memory (${code === 'ENOMEM' ? 'ENOMEM' : (e as Error).message}): the system has not that much memory or address space to give; ask for less`,
    { cause: e });
}
