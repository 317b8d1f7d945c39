// An NCCL communicator: one rank of a group of processes (one GPU each) that move device bytes
// to each other with NCCL's point-to-point and broadcast, over NVLink, PCIe, InfiniBand, RoCE or
// sockets, whatever NCCL finds. Communicators are non-blocking (ncclConfig_t.blocking = 0): every
// call that NCCL answers with ncclInProgress is polled to completion on a timer (poll.ts), so
// creating one or queuing work never blocks the event loop, and a timeout or signal can give up.
import { Stream, type MemoryTarget } from '../cuda/stream.js';
import type { Device } from '../cuda/device.js';
import { IpcError } from '../errors.js';
import { abortError, checkWaitOptions, raceWait, waitScope, type WaitOptions } from '../abort.js';
import { checkInteger, checkObject, invalidArgType, invalidArgValue, outOfRange, received } from '../arg-errors.js';
import { trackLeak, untrackLeak, type LeakToken } from '../leak.js';
import { nccl, NcclDataType } from './native.js';
import { NcclError, NcclResult, ncclResultName, type NcclResultName } from './errors.js';
import { NcclLibrary, loadNccl } from './library.js';
import { asNcclUniqueId, type NcclUniqueId } from './unique-id.js';
import { checkDevice, contextOf } from './device-context.js';
import { pollWhileInProgress } from './poll.js';

/** Device memory NCCL reads or writes: a pointer, or a buffer (whose byteLength bounds the bytes). */
export type NcclBuffer = bigint | MemoryTarget;

/** Options of NcclCommunicator.init. */
export interface NcclInitOptions extends WaitOptions {
  /** The id rank 0 (or any one rank) made with `uniqueId()` and sent to every other. */
  uniqueId: NcclUniqueId;
  /** How many ranks the communicator has. */
  nranks: number;
  /** This process's rank, 0 to nranks - 1. */
  rank: number;
  /** The GPU this rank works on; every rank needs its own (NCCL refuses two ranks on one GPU). */
  device: Device;
  /** The NCCL library to use (default: `await loadNccl()`). */
  library?: NcclLibrary;
}

/** Options of the calls that queue work: the stream, and when to give up waiting for NCCL to take it. */
export interface NcclCallOptions extends WaitOptions {
  /** The stream the work runs on, in order with other work there (default: the legacy default stream). */
  stream?: Stream;
}

/** One operation of `group()`. Byte counts; a broadcast is in place (root sends `buffer`, the others receive into theirs). */
export type NcclOperation =
  | { op: 'send'; buffer: NcclBuffer; bytes: number | bigint; peer: number }
  | { op: 'recv'; buffer: NcclBuffer; bytes: number | bigint; peer: number }
  | { op: 'broadcast'; buffer: NcclBuffer; bytes: number | bigint; root: number };

const noop = (): void => {};
/** Thrown inside a poll when abort() ended the communicator meanwhile. */
const ENDED = Symbol('ended');

function closedError(what: string): IpcError {
  return new IpcError('ERR_CLOSED', `${what}: this NcclCommunicator was closed or aborted; create a new one`);
}

/**
 * One rank of an NCCL communicator, on one GPU: `await NcclCommunicator.init({ uniqueId, nranks,
 * rank, device })` in every rank. Work is queued on a stream (`send`, `recv`, `broadcast`, several
 * at once with `group`): the promise resolves once NCCL took it; `await stream.synchronize()` to
 * know it finished. Calls are issued in the order they were made; each rank must make the matching
 * calls in the same order.
 *
 * End it with `close()` on every rank (collective), or `abort()` (local: for a communicator whose
 * peer died, or may have). `await using` closes; `using` aborts. One that is garbage-collected
 * while open is aborted, with a warning.
 */
export class NcclCommunicator {
  /** The NCCL library it runs on. */
  readonly library: NcclLibrary;
  /** The device it works on. */
  readonly device: Device;
  /** This rank (ncclCommUserRank). */
  readonly rank: number;
  /** Ranks in the communicator (ncclCommCount). */
  readonly nranks: number;
  /** The CUDA device ordinal NCCL uses (ncclCommCuDevice): the device's ordinal. */
  readonly cudaDevice: number;
  #handle: bigint;
  #leak: LeakToken;
  /** The last queued call's enqueue, while one is in flight. */
  #tail: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  /** ncclCommAbort / ncclCommDestroy, once started. */
  #end: Promise<void> | undefined;

  private constructor(library: NcclLibrary, device: Device, handle: bigint, rank: number, nranks: number, cudaDevice: number) {
    this.library = library;
    this.device = device;
    this.#handle = handle;
    this.rank = rank;
    this.nranks = nranks;
    this.cudaDevice = cudaDevice;
    // The backstop aborts, never destroys: destroying is collective and could wait forever.
    this.#leak = trackLeak(this, 'An NcclCommunicator', () => nccl.ncclCommEnd(handle, true, noop));
  }

  /**
   * Creates this rank's communicator (ncclCommInitRankConfig, non-blocking); resolves once every
   * rank joined. All ranks call it with the same uniqueId and nranks. `signal` / `timeout` give up
   * (AbortError / ERR_TIMEOUT), aborting what was created. Rejects with NcclError (ERR_NCCL) when
   * NCCL fails, NcclUnavailableError without a library.
   */
  static async init(options: NcclInitOptions): Promise<NcclCommunicator> {
    const o = checkObject<NcclInitOptions>(options, 'options');
    if (!o) throw invalidArgType(`The "options" argument must be of type object. ${received(options)}`);
    const uniqueId = asNcclUniqueId(o.uniqueId);
    const nranks = checkInteger(o.nranks, 'options.nranks', 1, 0x7fffffff);
    const rank = checkInteger(o.rank, 'options.rank', 0, nranks - 1);
    const device = checkDevice(o.device, 'options.device');
    if (o.library !== undefined && !(o.library instanceof NcclLibrary)) {
      throw invalidArgType(`The "options.library" property must be an NcclLibrary (from loadNccl()). ${received(o.library)}`);
    }
    const what = 'NcclCommunicator.init';
    const { signal } = checkWaitOptions(o);
    if (signal?.aborted) throw abortError(signal.reason, what);
    const scope = waitScope(o, what);
    try {
      const library = o.library ?? await raceWait(loadNccl(), { signal: scope.signal }, what);
      const context = contextOf(device);
      endAllOnExit();
      const [r, handle] = nccl.ncclCommInitRankConfig(library.id, context, nranks, uniqueId, rank, false);
      if (r !== NcclResult.ncclSuccess && r !== NcclResult.ncclInProgress) {
        const error = library.error(r, 'ncclCommInitRankConfig', handle);
        if (handle !== 0n) await endComm(library, handle, true).catch(noop);
        throw error;
      }
      const settle = async (): Promise<[number, number, number]> => {
        const state = await pollWhileInProgress(() => asyncState(library, handle), { signal: scope.signal }, what);
        if (state !== NcclResult.ncclSuccess) throw library.error(state, 'ncclCommInitRankConfig', handle);
        return [query(library, handle, 'ncclCommUserRank'), query(library, handle, 'ncclCommCount'), query(library, handle, 'ncclCommCuDevice')];
      };
      let facts: [number, number, number];
      try {
        facts = await settle();
      } catch (e) {
        await endComm(library, handle, true).catch(noop);
        throw e;
      }
      return new NcclCommunicator(library, device, handle, ...facts);
    } catch (e) {
      throw scope.translate(e);
    } finally {
      scope.done();
    }
  }

  /** True once close() or abort() was called. */
  get closed(): boolean {
    return this.#closing !== undefined || this.#end !== undefined;
  }

  /**
   * Queues sending `bytes` bytes of `buffer` to rank `peer` on `options.stream` (ncclSend). The
   * promise resolves when NCCL took the work; rejects with NcclError, or with the AbortError /
   * ERR_TIMEOUT of `options` (the communicator is then aborted: NCCL cannot take back work it
   * half took).
   */
  send(buffer: NcclBuffer, bytes: number | bigint, peer: number, options?: NcclCallOptions): Promise<void> {
    const [pointer, count] = this.#checkBuffer(buffer, bytes, 'buffer');
    const p = this.#checkRank(peer, 'peer');
    const stream = this.#checkOptions(options);
    return this.#submit('ncclSend', options, (h) => nccl.ncclSend(h, pointer, count, NcclDataType.uint8, p, stream));
  }

  /** Queues receiving `bytes` bytes from rank `peer` into `buffer` (ncclRecv); as send() otherwise. */
  recv(buffer: NcclBuffer, bytes: number | bigint, peer: number, options?: NcclCallOptions): Promise<void> {
    const [pointer, count] = this.#checkBuffer(buffer, bytes, 'buffer');
    const p = this.#checkRank(peer, 'peer');
    const stream = this.#checkOptions(options);
    return this.#submit('ncclRecv', options, (h) => nccl.ncclRecv(h, pointer, count, NcclDataType.uint8, p, stream));
  }

  /**
   * Queues an in-place broadcast of `bytes` bytes (ncclBroadcast): rank `root` sends its `buffer`,
   * every other rank receives into its own. Every rank calls it. As send() otherwise.
   */
  broadcast(buffer: NcclBuffer, bytes: number | bigint, root: number, options?: NcclCallOptions): Promise<void> {
    const [pointer, count] = this.#checkBuffer(buffer, bytes, 'buffer');
    const r = this.#checkRank(root, 'root');
    const stream = this.#checkOptions(options);
    return this.#submit('ncclBroadcast', options, (h) => nccl.ncclBroadcast(h, pointer, pointer, count, NcclDataType.uint8, r, stream));
  }

  /**
   * Queues several operations as one NCCL group (ncclGroupStart ... ncclGroupEnd): they proceed
   * together, so a rank may send to and receive from another at once without deadlock. All are
   * checked before any is queued. As send() otherwise.
   */
  group(operations: readonly NcclOperation[], options?: NcclCallOptions): Promise<void> {
    if (!Array.isArray(operations)) throw invalidArgType(`The "operations" argument must be an array. ${received(operations)}`);
    const issue = operations.map((o, i) => this.#checkOperation(o, i));
    const stream = this.#checkOptions(options);
    return this.#submit('ncclGroupEnd', options, (h) => {
      const started = nccl.ncclGroupStart(h);
      if (started !== NcclResult.ncclSuccess) throw this.library.error(started, 'ncclGroupStart', h);
      let failed: NcclError | undefined;
      for (const [call, fn] of issue) {
        const r = fn(h, stream);
        if (r !== NcclResult.ncclSuccess) {
          failed = this.library.error(r, call, h);
          break;
        }
      }
      // The group is closed whatever happened inside: NCCL then drops the ops it holds.
      const ended = nccl.ncclGroupEnd(h);
      if (failed) throw failed;
      return ended;
    });
  }

  /**
   * NCCL's asynchronous state of the communicator (ncclCommGetAsyncError): 'ncclSuccess' while
   * healthy, 'ncclInProgress' while NCCL is still taking queued work, an error name (e.g.
   * 'ncclRemoteError': a peer died or the network failed) once it broke; then abort() it.
   */
  asyncError(): NcclResultName {
    if (this.closed) throw closedError('NcclCommunicator.asyncError');
    return ncclResultName(asyncState(this.library, this.#handle));
  }

  /**
   * Aborts the communicator (ncclCommAbort): local, never waits for another rank, stops NCCL's
   * kernels and threads, frees what it holds. The right end for a communicator whose peer died or
   * may have; work queued on streams is abandoned (the streams stay usable). Runs on a thread of
   * its own; the promise resolves when it returned. Idempotent.
   */
  abort(): Promise<void> {
    if (!this.#end) this.#end = this.#endNow(true);
    return this.#end;
  }

  /**
   * Closes the communicator: ncclCommFinalize (waits for queued work, and for every rank), then
   * ncclCommDestroy. Collective: call it on every rank. A communicator with an asynchronous error
   * is aborted instead, as is one whose close gives up (`signal`, `timeout`: AbortError /
   * ERR_TIMEOUT), so pass a timeout where a peer may be gone. Idempotent.
   */
  close(options?: WaitOptions): Promise<void> {
    checkWaitOptions(options);
    if (!this.#closing) this.#closing = this.#end ?? this.#closeNow(options);
    return this.#closing;
  }

  /** Aborts (local; see abort()): `using comm = ...`. `await using` closes collectively instead. */
  [Symbol.dispose](): void {
    this.abort().catch((e: unknown) => process.emitWarning(`NcclCommunicator: abort failed: ${(e as Error).message}`, { code: 'CUDA_IPC_NCCL' }));
  }

  /** Same as close(): `await using comm = ...`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  async #closeNow(options: WaitOptions | undefined): Promise<void> {
    const what = 'NcclCommunicator.close';
    const scope = waitScope(options, what);
    try {
      // Queued calls finish first: their failures are theirs to report.
      if (this.#tail) await raceWait(this.#tail, { signal: scope.signal }, what);
      if (this.#end) return await this.#end;
      const h = this.#handle;
      const state = asyncState(this.library, h);
      if (state !== NcclResult.ncclSuccess) return await this.abort();  // finalize would wait for ranks that may be gone
      const r = nccl.ncclCommFinalize(h);
      if (r !== NcclResult.ncclSuccess && r !== NcclResult.ncclInProgress) {
        const error = this.library.error(r, 'ncclCommFinalize', h);
        await this.abort().catch(noop);
        throw error;
      }
      const final = await pollWhileInProgress(() => this.#state(), { signal: scope.signal }, what);
      if (final !== NcclResult.ncclSuccess) {
        const error = this.library.error(final, 'ncclCommFinalize', h);
        await this.abort().catch(noop);
        throw error;
      }
      this.#end = this.#endNow(false);
      await this.#end;
    } catch (e) {
      if (e === ENDED) return await this.#end;
      const error = scope.translate(e);
      if (!this.#end) await this.abort().catch(noop);  // gave up waiting: abort is the only safe end
      throw error;
    } finally {
      scope.done();
    }
  }

  /** asyncError's number, or ENDED once abort() ended the communicator. */
  #state(): number {
    if (this.#end) throw ENDED;
    return asyncState(this.library, this.#handle);
  }

  #endNow(abort: boolean): Promise<void> {
    const handle = this.#handle;
    this.#handle = 0n;
    untrackLeak(this.#leak);
    return endComm(this.library, handle, abort);
  }

  /**
   * Issues `issue` once the calls before it were taken, then polls while NCCL answers
   * ncclInProgress. Giving up (options) aborts the communicator.
   */
  #submit(call: string, options: NcclCallOptions | undefined, issue: (handle: bigint) => number): Promise<void> {
    if (this.closed) throw closedError(`NcclCommunicator: ${call}`);
    const run = (): Promise<void> => this.#issue(call, options, issue);
    const before = this.#tail;
    const p = before ? before.then(run, run) : run();
    const tail = p.then(noop, noop);
    this.#tail = tail;
    void tail.then(() => { if (this.#tail === tail) this.#tail = undefined; });
    return p;
  }

  async #issue(call: string, options: NcclCallOptions | undefined, issue: (handle: bigint) => number): Promise<void> {
    if (this.#end) throw closedError(`NcclCommunicator: ${call}`);
    const h = this.#handle;
    const r = issue(h);
    if (r === NcclResult.ncclSuccess) return;
    if (r !== NcclResult.ncclInProgress) throw this.library.error(r, call, h);
    let state: number;
    try {
      state = await pollWhileInProgress(() => this.#state(), options, `NcclCommunicator: ${call}`);
    } catch (e) {
      if (e === ENDED) throw closedError(`NcclCommunicator: ${call}`);
      await this.abort().catch(noop);  // NCCL holds half-taken work: nothing but abort ends it safely
      throw e;
    }
    if (state !== NcclResult.ncclSuccess) throw this.library.error(state, call, h);
  }

  #checkOptions(options: NcclCallOptions | undefined): bigint {
    checkWaitOptions(options);
    const stream = options?.stream;
    if (stream === undefined) return 0n;
    if (!(stream instanceof Stream)) throw invalidArgType(`The "options.stream" property must be a Stream. ${received(stream)}`);
    if (stream.device !== this.device) {
      throw invalidArgValue(`options.stream belongs to device ${stream.device.ordinal}; this communicator works on device ${this.device.ordinal}`);
    }
    return stream.handle;
  }

  #checkRank(value: unknown, name: string): number {
    return checkInteger(value, name, 0, this.nranks - 1);
  }

  #checkBuffer(buffer: unknown, bytes: unknown, name: string): [bigint, bigint] {
    let pointer: bigint;
    let limit: number | undefined;
    if (typeof buffer === 'bigint') {
      pointer = buffer;
    } else if (typeof buffer === 'object' && buffer !== null && typeof (buffer as MemoryTarget).devicePointer === 'bigint') {
      pointer = (buffer as MemoryTarget).devicePointer;
      limit = (buffer as MemoryTarget).byteLength;
    } else {
      throw invalidArgType(`The "${name}" argument must be a device pointer (bigint) or a buffer with devicePointer. ${received(buffer)}`);
    }
    if (pointer < 0n || pointer >= 1n << 64n) throw outOfRange(`The "${name}" pointer must fit in 64 bits unsigned`);
    let count: bigint;
    if (typeof bytes === 'bigint') count = bytes;
    else if (typeof bytes === 'number' && Number.isSafeInteger(bytes)) count = BigInt(bytes);
    else throw invalidArgType(`The "bytes" argument must be an integer (number or bigint). ${received(bytes)}`);
    if (count < 0n || count >= 1n << 63n) throw outOfRange(`The value of "bytes" is out of range. It must be >= 0. Received ${String(bytes)}`);
    if (limit !== undefined && count > BigInt(limit)) {
      throw outOfRange(`${count} bytes do not fit in the ${limit}-byte ${name}`);
    }
    return [pointer, count];
  }

  #checkOperation(o: unknown, i: number): [string, (h: bigint, stream: bigint) => number] {
    const where = `operations[${i}]`;
    if (typeof o !== 'object' || o === null) throw invalidArgType(`${where} must be an object. ${received(o)}`);
    const op = o as NcclOperation;
    if (op.op === 'send' || op.op === 'recv') {
      const [pointer, count] = this.#checkBuffer(op.buffer, op.bytes, `${where}.buffer`);
      const peer = this.#checkRank(op.peer, `${where}.peer`);
      return op.op === 'send'
        ? ['ncclSend', (h, s) => nccl.ncclSend(h, pointer, count, NcclDataType.uint8, peer, s)]
        : ['ncclRecv', (h, s) => nccl.ncclRecv(h, pointer, count, NcclDataType.uint8, peer, s)];
    }
    if (op.op === 'broadcast') {
      const [pointer, count] = this.#checkBuffer(op.buffer, op.bytes, `${where}.buffer`);
      const root = this.#checkRank(op.root, `${where}.root`);
      return ['ncclBroadcast', (h, s) => nccl.ncclBroadcast(h, pointer, pointer, count, NcclDataType.uint8, root, s)];
    }
    throw invalidArgValue(`${where}.op must be 'send', 'recv' or 'broadcast'. ${received((op as { op?: unknown }).op)}`);
  }
}

let endsOnExit = false;
/**
 * On process exit, communicators still open are aborted and those being ended are waited for,
 * synchronously: exit() tears CUDA and NCCL down under NCCL's own threads otherwise, and the
 * process dies of SIGSEGV instead of exiting with its code (environment cleanup hooks, which do
 * this for a worker thread, do not run on process.exit()).
 */
function endAllOnExit(): void {
  if (endsOnExit) return;
  endsOnExit = true;
  process.once('exit', () => nccl.ncclEndAllNow());
}

/** ncclCommGetAsyncError's state, checked. */
function asyncState(library: NcclLibrary, handle: bigint): number {
  const [r, state] = nccl.ncclCommGetAsyncError(handle);
  if (r !== NcclResult.ncclSuccess) throw library.error(r, 'ncclCommGetAsyncError', handle);
  return state;
}

/** ncclCommUserRank / Count / CuDevice, checked. */
function query(library: NcclLibrary, handle: bigint, call: 'ncclCommUserRank' | 'ncclCommCount' | 'ncclCommCuDevice'): number {
  const [r, value] = nccl[call](handle);
  if (r !== NcclResult.ncclSuccess) throw library.error(r, call, handle);
  return value;
}

/** ncclCommAbort or ncclCommDestroy on the addon's own thread; rejects with NcclError when it fails. */
function endComm(library: NcclLibrary, handle: bigint, abort: boolean): Promise<void> {
  return new Promise((resolve, reject) => {
    const call = abort ? 'ncclCommAbort' : 'ncclCommDestroy';
    try {
      nccl.ncclCommEnd(handle, abort, (result, lastError) => {
        if (result === NcclResult.ncclSuccess) resolve();
        else reject(new NcclError(result, call, nccl.ncclGetErrorString(library.id, result), lastError));
      });
    } catch (e) {
      reject(e);
    }
  });
}
