// The NCCL part of the addon (native/nccl.cc): near 1:1 with NCCL's API. Every call that NCCL
// answers with an ncclResult_t returns that number (with its out-value, as a pair) for errors.ts
// to check; only bad arguments and unknown handles throw here.
import { addon } from '../native/addon.js';

/** What ncclOpen found in a library file. */
export interface NcclOpened {
  /** The addon's index of the library, passed to the calls that need one. */
  library: number;
  /** The file the dynamic loader chose (dladdr), or the path given. */
  path: string;
  /** ncclGetVersion's code, e.g. 22809 for 2.28.9. */
  version: number;
}

export interface NcclAddon {
  /** dlopen + dlsym of every entry point + ncclGetVersion; throws an Error with code ERR_DLOPEN, ERR_NCCL_SYMBOLS or ERR_NCCL_VERSION. */
  ncclOpen(path: string): NcclOpened;
  ncclGetErrorString(library: number, result: number): string;
  /** The library's last error text (comm 0n: none given). */
  ncclGetLastError(library: number, comm: bigint): string;
  /** Writes the 128-byte id into `out` on success. */
  ncclGetUniqueId(library: number, out: Uint8Array): number;
  /** context 0n: no context switch (a test's stand-in device). */
  ncclCommInitRankConfig(library: number, context: bigint, nranks: number, uniqueId: Uint8Array, rank: number, blocking: boolean): [result: number, comm: bigint];
  ncclCommGetAsyncError(comm: bigint): [result: number, asyncError: number];
  ncclCommFinalize(comm: bigint): number;
  ncclCommCount(comm: bigint): [result: number, count: number];
  ncclCommCuDevice(comm: bigint): [result: number, device: number];
  ncclCommUserRank(comm: bigint): [result: number, rank: number];
  ncclSend(comm: bigint, pointer: bigint, count: bigint, datatype: number, peer: number, stream: bigint): number;
  ncclRecv(comm: bigint, pointer: bigint, count: bigint, datatype: number, peer: number, stream: bigint): number;
  ncclBroadcast(comm: bigint, sendPointer: bigint, recvPointer: bigint, count: bigint, datatype: number, root: number, stream: bigint): number;
  ncclGroupStart(comm: bigint): number;
  ncclGroupEnd(comm: bigint): number;
  /** Unregisters `comm` now; ncclCommAbort (abort) or ncclCommDestroy runs on a thread of its own, then `callback`. */
  ncclCommEnd(comm: bigint, abort: boolean, callback: (result: number, lastError: string) => void): void;
  /** Communicators this thread registered and has not ended. */
  ncclCommsOpen(): number;
  /** Joins the threads ending communicators and aborts every one still open, blocking; returns how many it aborted. For process exit. */
  ncclEndAllNow(): number;
}

export const nccl = addon as unknown as NcclAddon;

/** ncclDataType_t values the layer uses: it moves bytes. */
export const NcclDataType = { int8: 0, uint8: 1 } as const;
