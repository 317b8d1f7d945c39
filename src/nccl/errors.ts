// NCCL's results and the error a failed call throws: an IpcError with code ERR_NCCL that names the
// result (ncclRemoteError...), the call, and what the library said about it.
import { IpcError } from '../errors.js';

/** ncclResult_t values by name (nccl.h). */
export const NcclResult = {
  ncclSuccess: 0,
  ncclUnhandledCudaError: 1,
  ncclSystemError: 2,
  ncclInternalError: 3,
  ncclInvalidArgument: 4,
  ncclInvalidUsage: 5,
  ncclRemoteError: 6,
  ncclInProgress: 7,
  ncclTimeout: 8,
} as const;

/** The name of an ncclResult_t (`ncclResult(<n>)` for a number newer than this package). */
export type NcclResultName = keyof typeof NcclResult | `ncclResult(${number})`;

const names = new Map<number, NcclResultName>(Object.entries(NcclResult).map(([k, v]) => [v, k as NcclResultName]));

/** The name of `result`, e.g. 'ncclRemoteError' for 6. */
export function ncclResultName(result: number): NcclResultName {
  return names.get(result) ?? `ncclResult(${result})`;
}

/** What to do about a result, where there is something to say. */
function hint(result: number): string {
  switch (result) {
    case NcclResult.ncclRemoteError:
    case NcclResult.ncclSystemError:
    case NcclResult.ncclTimeout:
      return 'a peer exited or the network failed: abort() the communicator (close() would wait for every rank) and make a new one';
    case NcclResult.ncclUnhandledCudaError:
      return 'a CUDA call inside NCCL failed; run with NCCL_DEBUG=WARN for details';
    case NcclResult.ncclInvalidUsage:
      return 'every rank must load the same NCCL version and use its own GPU; run with NCCL_DEBUG=WARN for details';
    default:
      return '';
  }
}

/**
 * An NCCL call failed (IpcError code ERR_NCCL): `result` is NCCL's name for it, `call` the
 * function, `description` ncclGetErrorString's text and `lastError` ncclGetLastError's.
 */
export class NcclError extends IpcError {
  override name = 'NcclError';
  /** NCCL's name for the result, e.g. 'ncclRemoteError'. */
  readonly result: NcclResultName;
  /** The ncclResult_t number. */
  readonly status: number;
  /** The NCCL function whose result this is, e.g. 'ncclRecv' (for a result found later by polling: the call that started the work). */
  readonly call: string;
  /** ncclGetErrorString's text for the result. */
  readonly description: string;
  /** ncclGetLastError's text: the library's last warning, often the actual reason ('' when none). */
  readonly lastError: string;

  constructor(status: number, call: string, description: string, lastError: string) {
    const result = ncclResultName(status);
    const extra = hint(status);
    super('ERR_NCCL',
      `${call} failed: ${result} (${status}): ${description || 'no description'}` +
      `${lastError ? `; NCCL says: ${lastError.trim()}` : ''}${extra ? `. ${extra}` : ''}`);
    this.result = result;
    this.status = status;
    this.call = call;
    this.description = description;
    this.lastError = lastError;
  }
}

/** One place loadNccl looked for NCCL, and why it was not used. */
export interface NcclAttempt {
  /** 'option' (the path given), 'env' (CUDA_IPC_NCCL_LIBRARY), 'system' (libnccl.so.2 on the loader's path) or 'wheel' (PyTorch's). */
  source: 'option' | 'env' | 'system' | 'wheel';
  /** The file tried, or the place looked in when it yielded none. */
  path: string;
  /** Why it was not used. */
  error: string;
}

/** No usable NCCL library was found (IpcError code ERR_NCCL_UNAVAILABLE); `attempts` says where it looked. */
export class NcclUnavailableError extends IpcError {
  override name = 'NcclUnavailableError';
  /** Every place looked in, in order, and why each failed. */
  readonly attempts: readonly NcclAttempt[];
  constructor(message: string, attempts: readonly NcclAttempt[]) {
    super('ERR_NCCL_UNAVAILABLE', message);
    this.attempts = attempts;
  }
}
