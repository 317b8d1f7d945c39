// Prepared pool exports: the 64 bytes of cuMemPoolExportPointer made by the addon's worker thread
// right after an allocation (native/pool_exports.cc), so that sending a fresh pool buffer finds
// them ready instead of paying the driver call (15-18 us on an H100) on the event loop. The slots
// are an ArrayBuffer shared with that thread: this side writes a request (pointer, context), marks
// it queued and posts it; the thread marks it running, exports, and marks it ready (or failed).
// Each request is taken exactly once, by the send that needs the data or by the release of the
// memory; both wait out a running export, so the driver never exports a pointer whose memory was
// freed, and a freed allocation's slot never hands its data to another.
//
// Stream order: the export runs after cuMemAllocFromPoolAsync returned, as an inline export at
// send time would; it reads no memory. (The importer must still not touch the memory before the
// allocating stream reached the allocation: as before, that is the sender's business.)

/** What the worker thread offers (the addon's exportWorkerStart/Post; tests give a stand-in). */
export interface ExportWorkerBackend {
  start(table: ArrayBuffer): void;
  post(slot: number): void;
}

export const SLOT_BYTES = 128;
const DATA_OFFSET = 64;
export const enum SlotState {
  Free = 0,
  Queued = 1,
  Running = 2,
  Ready = 3,
  Failed = 4,
}

export class PreparedExports {
  readonly #backend: ExportWorkerBackend;
  readonly #table: ArrayBuffer;
  readonly #state: Int32Array;
  readonly #words: BigUint64Array;
  readonly #bytes: Uint8Array;
  readonly #free: number[] = [];
  #started = false;

  /** `table` defaults to a new one of `slots` slots (a test passes a SharedArrayBuffer). */
  constructor(backend: ExportWorkerBackend, slots = 256, table: ArrayBuffer = new ArrayBuffer(slots * SLOT_BYTES)) {
    this.#backend = backend;
    this.#table = table;
    this.#state = new Int32Array(table);
    this.#words = new BigUint64Array(table);
    this.#bytes = new Uint8Array(table);
    for (let i = table.byteLength / SLOT_BYTES - 1; i >= 0; i--) this.#free.push(i);
  }

  /** Slots free for requests. */
  get available(): number {
    return this.#free.length;
  }

  /**
   * Asks for the export data of `pointer` (an allocation in the primary context `context`);
   * returns the request's slot, or -1 when every slot is taken (the send then exports inline).
   */
  prepare(pointer: bigint, context: bigint): number {
    const slot = this.#free.pop();
    if (slot === undefined) return -1;
    try {
      if (!this.#started) {
        this.#backend.start(this.#table);
        this.#started = true;
      }
      this.#words[slot * (SLOT_BYTES / 8) + 1] = pointer;
      this.#words[slot * (SLOT_BYTES / 8) + 2] = context;
      Atomics.store(this.#state, slot * (SLOT_BYTES / 4), SlotState.Queued);
      this.#backend.post(slot);
    } catch (e) {
      Atomics.store(this.#state, slot * (SLOT_BYTES / 4), SlotState.Free);
      this.#free.push(slot);
      throw e;
    }
    return slot;
  }

  /**
   * Ends request `slot`: copies its export data into `out` (64 bytes) and returns true when the
   * worker made it; returns false when it had not started (taken back) or failed: the caller then
   * exports inline, which also reports the driver's error. Waits while the worker is exporting.
   */
  take(slot: number, out: Uint8Array | undefined): boolean {
    const at = slot * (SLOT_BYTES / 4);
    let s = Atomics.compareExchange(this.#state, at, SlotState.Queued, SlotState.Free);
    if (s === SlotState.Queued) {
      this.#free.push(slot);
      return false;
    }
    if (s === SlotState.Free) throw new Error(`cuda-ipc internal error: prepared export slot ${slot} was taken twice`);
    // Running: the driver call takes some microseconds; nothing else can end it.
    while (s === SlotState.Running) s = Atomics.load(this.#state, at);
    const ok = s === SlotState.Ready;
    if (ok && out) out.set(this.#bytes.subarray(slot * SLOT_BYTES + DATA_OFFSET, (slot + 1) * SLOT_BYTES));
    Atomics.store(this.#state, at, SlotState.Free);
    this.#free.push(slot);
    return ok;
  }
}
