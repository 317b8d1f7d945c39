// Types of the addon's channel primitives (native/channel.cc). Offsets are byte offsets into the
// mapping, checked for alignment and bounds on every call (RangeError otherwise). 64-bit values
// are JS numbers below 2^53; a stored value above that reads as -1.

/** Its own mmap(MAP_SHARED) of a shared-memory fd, with sequentially consistent atomics. */
export interface NativeSharedWords {
  load32(offset: number): number;
  store32(offset: number, value: number): void;
  /** Returns the value seen: equal to `expected` when the swap happened. */
  cas32(offset: number, expected: number, desired: number): number;
  /** fetch-add (wrapping); returns the previous value. */
  add32(offset: number, delta: number): number;
  /** fetch-and; returns the previous value. */
  and32(offset: number, mask: number): number;
  /** fetch-or; returns the previous value. */
  or32(offset: number, mask: number): number;
  load64(offset: number): number;
  store64(offset: number, value: number): void;
  cas64(offset: number, expected: number, desired: number): number;
  add64(offset: number, delta: number): number;
  /**
   * For i in 0..count-1, the word at offset + ((start + i) % count) * stride: swaps the first
   * whose (value & mask) === expect for `desired` and returns its index; -1 when none.
   */
  claimFirst32(offset: number, stride: number, count: number, start: number, mask: number, expect: number, desired: number): number;
  /** Spins on this thread while the word equals `expected`, for at most `micros` (capped at 100 ms).
   * True when it changed. Blocks the event loop: spin mode only. */
  spinWait32(offset: number, expected: number, micros: number): boolean;
  /** Spins trying to swap expected -> desired for at most `micros`; true once swapped. */
  spinCas32(offset: number, expected: number, desired: number, micros: number): boolean;
  /** Unmaps; every later call throws EBADF. */
  close(): void;
  readonly byteLength: number;
  readonly address: bigint;
}

/**
 * Polls an eventfd (borrowed: close the Doorbell before the fd) on this thread's event loop; each
 * time the eventfd is rung it is drained and `callback(0)` runs (`callback(-errno)` when polling
 * failed; polling then stops). Unref'd unless between ref() and unref().
 */
export interface NativeDoorbell {
  ref(): void;
  unref(): void;
  /** Stops polling. Idempotent. */
  close(): void;
  readonly closed: boolean;
}

/** The layout fields the C ring needs (struct cip_ring). */
export interface CRingLayout {
  slotCount: number;
  maxParticipants: number;
  /** 1 broadcast, 0 work sharing. */
  broadcast: number;
  participantsOffset: number;
  ringOffset: number;
  slotRecordsOffset: number;
  slotRecordBytes: number;
  metaBytes: number;
  slotBytesLo: number;
  slotBytesHi: number;
  expectConsumers: number;
}

/**
 * The C ring of native/py/channel_ring.c for one channel end (native/c_ring.cc): each method is the
 * C function of its name and returns its result code (negative: CIP_* of channel_ring.h).
 */
export interface NativeCRing {
  /** cip_acquire: a slot claimed after the end's checks, or CIP_NONE / NOT_ALIVE / CONSUMERS_GONE / CLOSED. */
  acquire(): number;
  /** cip_claim_slots of one: a slot claimed, CIP_NONE, or CIP_CLOSED. */
  claim(): number;
  /** cip_has_free: 1 / 0, or CIP_CLOSED. */
  hasFree(): number;
  /** cip_publish_written: 0 ok, 1 busy, 2 dropped, 3 detached; CIP_CORRUPT / INVALID / CLOSED. */
  publishWritten(slot: number): number;
  /** cip_discard: 0; CIP_INVALID / CLOSED. */
  discard(slot: number): number;
  /** cip_take_message: the slot (| CIP_TAKEN_DETACHED | CIP_TAKEN_BAD), its position in out[0]; CIP_NONE / CORRUPT / CLOSED. */
  take(): number;
  /** cip_release: 1 freed, 0 no longer held; CIP_INVALID / CLOSED. */
  release(slot: number): number;
  /** cip_peek (broadcast): the slot published at `cursor`; CIP_NONE / SKIP / CORRUPT / CLOSED. */
  peek(cursor: number): number;
  /** cip_release_held (broadcast): 1 dropped participant k's hold, 0 it held none; CIP_INVALID / CLOSED. */
  releaseHeld(slot: number, participant: number): number;
  /** What the last CIP_CORRUPT found: [ERR_* code, a, b]. */
  error(): [number, number, number];
  /** cip_ring_detach and unmap: every later call returns CIP_CLOSED. Idempotent. */
  detach(): void;
}

export interface ChannelAddon {
  /**
   * Maps `length` bytes of the control block's `fd` (borrowed; sealed against shrinking) as
   * participant `me`'s C ring. `bells` (borrowed eventfds, detach() before they close), `taken`
   * (slotCount words, shared with the JavaScript side) and `out` (take()'s position) stay referenced.
   * Absent from an addon built before it.
   */
  CRing?: (new (fd: number, length: number, layout: CRingLayout, me: number, bells: Int32Array, taken: Uint32Array, out: Float64Array) => NativeCRing) & { abiVersion: number };
  /** Maps `length` bytes of `fd` (borrowed: the caller still owns and closes it). The fd must be a
   * regular file at least that long, sealed against shrinking (EINVAL / EPERM otherwise). */
  SharedWords: new (fd: number, length: number) => NativeSharedWords;
  Doorbell: new (fd: number, callback: (status: number) => void) => NativeDoorbell;
  /** A new eventfd: count 0, non-blocking, close-on-exec. */
  eventfdCreate(): number;
  /** Adds 1 to the eventfd's count (its poller wakes). */
  eventfdRing(fd: number): void;
  /** Reads and resets the count; 0 when it was 0. */
  eventfdDrain(fd: number): number;
  /** Whether fd is an eventfd. */
  isEventfd(fd: number): boolean;
}
