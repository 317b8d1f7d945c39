// Typed errors. CudaError mirrors a failed driver call; IpcError carries a stable `code` that
// programs can switch on, and a message that says what went wrong and what to do instead.

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
  // channels
  | 'ERR_CHANNEL_CLOSED'
  | 'ERR_CHANNEL_CORRUPT'
  // tensors (src/tensors)
  | 'ERR_TENSOR_MISMATCH'
  | 'ERR_SAFETENSORS_INVALID';

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
