// The channel control block: a shared-memory file (memfd) that every participant maps.
// docs/channel-protocol.md describes it for other implementations; this comment is the summary.
//
// Layout version 4 (version 3 kept the data sequence on the consumers' line and the space
// sequence on the producers' line, so every publish and every release pulled the other side's line;
// version 2 counted sleepers and woke them with futexes; version 1 ordered device slots with
// interprocess events). All integers little-endian; every byte not named here
// is zero when the block is created, and the header's reserved bytes are checked to be zero by
// importers. Offsets of the tables follow from (slotCount, metaBytes, maxParticipants, device)
// alone, and an importer recomputes them and refuses a block that disagrees.
//
// Header, 320 bytes (five 64-byte lines; each hot line is written by one side only on the hot
// path, so that a message moves as few lines between cores as it can):
//   0   u32  magic 0x4c4e4843 ("CHNL")
//   4   u16  version (4)
//   6   u16  header bytes (320)
//   8   u32  flags: bit 0 device slots, bit 1 broadcast; other bits zero
//   12  u32  slot count
//   16  u64  slot bytes
//   24  u32  meta bytes per slot (multiple of 8)
//   28  u32  max participants (2..32), the hub included
//   32  u32  participants offset (256)
//   36  u32  ring offset
//   40  u32  slot records offset
//   44  u32  slot record bytes
//   48  u64  total bytes
//   56  u32  expected producers (consumers end only after this many attached and all left)
//   60  u32  expected consumers
//   -- publish line (producers write it on every publish; a consumer reads it once per batch)
//   64  u64  tail: the next ring position to publish
//   72  u32  publish lock: 0 free, else participant index + 1
//   76  u32  data sequence: bumped on every publish and membership change (spinners watch it)
//   80  u32  data sleepers: bit k set while participant k sleeps until a message comes
//   84  u32  consumer mask: bit i set while participant i is an attached consumer
//   -- take line (work-sharing consumers)
//   128 u64  head: the next ring position to take (work sharing; may lag, anyone advances it)
//   -- counters
//   192 u32  producers attached (ever)   196 u32 producers live   200 u32 producers died
//   204 u32  consumers attached (ever)   208 u32 consumers live   212 u32 consumers died
//   220 u32  fences offset (device slots; 0 for host slots)
//   -- space line (consumers write it on every release; a producer reads it when it waits)
//   256 u32  space sequence: bumped when a slot is freed or membership changes (spinners watch it)
//   260 u32  space sleepers: bit k set while participant k sleeps until a slot frees up
//
// Waking: participant k sleeps on its doorbell, eventfd k of the set the hub made with the block
// (one per participant entry, handed to every participant at attach). To sleep it sets its bit in
// a sleepers word, re-checks, and only then polls its doorbell; whoever changes what it waits for
// (publish, release, membership) makes the change first, then clears sleeper bits with an atomic
// and-not and rings the doorbell of each participant whose bit it cleared. Both sides use
// sequentially consistent operations, so at least one of them sees the other: no lost wake-up.
//
// Participants, maxParticipants x 64 bytes at 320 (entry 0 is the hub):
//   0   u32  state: 0 empty, 1 alive, 2 ended, 3 dead, 4 being recovered (or attaching)
//   4   u32  role: 1 producer, 2 consumer, 3 the hub (neither)
//   8   u32  pid
//   12  u32  flags: bit 0 an end in the hub's own process (its peers recover it with the hub)
//   16  u64  cursor: broadcast consumers start at this ring position
//   24  u32  attach generation (how many times this entry was handed out)
//
// Ring, slotCount x u32 (rounded up to 64 bytes): ring[p % slotCount] is the slot published at
// position p, for head <= p < tail (broadcast: for each consumer's cursor <= p < tail).
//
// Slot records, slotCount x (64 + metaBytes rounded up to 64):
//   0   u32  state word: kind (bits 0-7: 0 free, 1 writing, 2 published, 3 taken) | owner
//            participant (bits 8-15: the writer, the publisher, or the taker) | flags (bits 16-31:
//            bit 16 redelivered; bits 17-31 published and taken: the low 15 bits of the position
//            the message was published at, so that a taker whose slot was consumed and published
//            again meanwhile fails its compare-and-swap instead of taking the newer message)
//   4   u32  holders: broadcast consumers that still hold the message (bit per participant)
//   8   u64  position of the current message
//   16  u64  length: bytes of the slot the message uses
//   24  u32  meta length     28  u32 meta kind: 0 none, 1 JSON (UTF-8), 2 raw bytes
//   32  u32  publisher participant index
//   36  u32  last holders: the holders mask when the message was published (broadcast; the
//            producer's GPU work waits for their release fences before reusing the slot)
//   40  u32  deliveries: how many times the message was taken (work sharing)
//   44  u32  ticket: the message's publish ticket (the previous one + 1, per slot; wrapping)
//   48  u32  released by: the consumer that released the slot last (work sharing)
//   52  u32  release ticket: the ticket of the message it released
//   64  ...  meta bytes
//
// Fences (device slots only; see fences.ts), 32-bit words the GPU writes and waits on:
//   publish fences: slotCount x u32 (rounded up to 64 bytes): slot s reaches the ticket of its
//     message once the producer's GPU work before publish is done
//   release fences: maxParticipants rows of slotCount x u32 (each row rounded up to 64 bytes):
//     row k, slot s reaches a message's ticket once consumer k's GPU work on it is done
import { IpcError } from '../errors.js';
import { outOfRange } from '../arg-errors.js';

export const MAGIC = 0x4c4e4843;
export const VERSION = 4;
export const HEADER_BYTES = 320;
export const PARTICIPANT_BYTES = 64;
export const SLOT_HEADER_BYTES = 64;

export const FLAG_DEVICE = 1;
export const FLAG_BROADCAST = 2;

export const H = {
  magic: 0,
  version: 4,
  headerBytes: 6,
  flags: 8,
  slotCount: 12,
  slotBytes: 16,
  metaBytes: 24,
  maxParticipants: 28,
  participantsOffset: 32,
  ringOffset: 36,
  slotRecordsOffset: 40,
  slotRecordBytes: 44,
  totalBytes: 48,
  expectProducers: 56,
  expectConsumers: 60,
  tail: 64,
  lock: 72,
  dataSeq: 76,
  dataSleepers: 80,
  consumerMask: 84,
  head: 128,
  producersAttached: 192,
  producersLive: 196,
  producersDied: 200,
  consumersAttached: 204,
  consumersLive: 208,
  consumersDied: 212,
  fencesOffset: 220,
  spaceSeq: 256,
  spaceSleepers: 260,
} as const;

/** Header byte ranges that must stay zero (reserved). */
const RESERVED: ReadonlyArray<readonly [number, number]> = [[88, 128], [136, 192], [216, 220], [224, 256], [264, 320]];

export const P = { state: 0, role: 4, pid: 8, flags: 12, cursor: 16, generation: 24 } as const;
/** Participant flag: an end in the hub's process, recovered by the peers together with the hub. */
export const PFLAG_HUB_LOCAL = 1;
export const PState = { Empty: 0, Alive: 1, Ended: 2, Dead: 3, Recovering: 4 } as const;
export const PRole = { Producer: 1, Consumer: 2, Hub: 3 } as const;

export const S = {
  state: 0, holders: 4, position: 8, length: 16, metaLength: 24, metaKind: 28, publisher: 32, lastHolders: 36,
  deliveries: 40, ticket: 44, releasedBy: 48, releaseTicket: 52, meta: 64,
} as const;
export const Kind = { Free: 0, Writing: 1, Published: 2, Taken: 3 } as const;
export const FLAG_REDELIVERED = 1 << 16;
const GEN_SHIFT = 17;
export const GEN_MASK = (0x7fff << GEN_SHIFT) >>> 0;
/** The generation bits of a message published at `position`. */
export const genOf = (position: number): number => ((position % 0x8000) << GEN_SHIFT) >>> 0;
export const MetaKind = { None: 0, Json: 1, Bytes: 2 } as const;

export const slotWord = (kind: number, owner: number, flags = 0): number => (kind | (owner << 8) | flags) >>> 0;
export const kindOf = (word: number): number => word & 0xff;
export const ownerOf = (word: number): number => (word >>> 8) & 0xff;
export const flagsOf = (word: number): number => word & 0xffff0000;

export const LIMITS = {
  maxSlots: 65536,
  /** Device slots: the control block holds a release fence per slot and participant. */
  maxDeviceSlots: 4096,
  maxMetaBytes: 65536,
  minParticipants: 2,
  maxParticipants: 32,
} as const;

export interface LayoutParams {
  slotCount: number;
  slotBytes: number;
  metaBytes: number;
  maxParticipants: number;
  device: boolean;
  broadcast: boolean;
}

export interface Layout extends LayoutParams {
  participantsOffset: number;
  ringOffset: number;
  slotRecordsOffset: number;
  slotRecordBytes: number;
  /** Device slots: where the fences start (0: none). */
  fencesOffset: number;
  releaseFencesOffset: number;
  /** Bytes per row of release fences (one row per participant). */
  releaseFenceRowBytes: number;
  totalBytes: number;
}

/** A layout with the membership expectations of the header. */
export interface HubLayout extends Layout {
  expectProducers: number;
  expectConsumers: number;
}

/** The bit of participant k in a mask word. */
export const bitOf = (k: number): number => (1 << k) >>> 0;

const roundUp = (n: number, to: number) => Math.ceil(n / to) * to;

/** Throws a RangeError (ERR_OUT_OF_RANGE; for a received block, IpcError `code`) unless the parameters are in range. */
export function checkParams(p: LayoutParams, code: 'arg' | 'ERR_DESCRIPTOR_INVALID' = 'arg'): void {
  const fail = (what: string) => { throw code === 'arg' ? outOfRange(what) : new IpcError(code, what); };
  const maxSlots = p.device ? LIMITS.maxDeviceSlots : LIMITS.maxSlots;
  if (!Number.isSafeInteger(p.slotCount) || p.slotCount < 1 || p.slotCount > maxSlots) {
    fail(`slots must be an integer in 1..${maxSlots}${p.device ? ' for device memory' : ''}; got ${String(p.slotCount)}`);
  }
  if (!Number.isSafeInteger(p.slotBytes) || p.slotBytes < 1 || p.slotCount * p.slotBytes > Number.MAX_SAFE_INTEGER) {
    fail(`slotBytes must be a positive integer; got ${String(p.slotBytes)}`);
  }
  if (!Number.isSafeInteger(p.metaBytes) || p.metaBytes < 0 || p.metaBytes > LIMITS.maxMetaBytes || p.metaBytes % 8 !== 0) {
    fail(`metaBytes must be a multiple of 8 in 0..${LIMITS.maxMetaBytes}; got ${String(p.metaBytes)}`);
  }
  if (!Number.isSafeInteger(p.maxParticipants) || p.maxParticipants < LIMITS.minParticipants || p.maxParticipants > LIMITS.maxParticipants) {
    fail(`maxPeers + 1 must be in ${LIMITS.minParticipants}..${LIMITS.maxParticipants}; got ${String(p.maxParticipants)} participants`);
  }
}

export function computeLayout(p: LayoutParams): Layout {
  const participantsOffset = HEADER_BYTES;
  const ringOffset = participantsOffset + p.maxParticipants * PARTICIPANT_BYTES;
  const slotRecordsOffset = ringOffset + roundUp(p.slotCount * 4, 64);
  const slotRecordBytes = SLOT_HEADER_BYTES + roundUp(p.metaBytes, 64);
  const recordsEnd = slotRecordsOffset + p.slotCount * slotRecordBytes;
  const fenceRow = roundUp(p.slotCount * 4, 64);
  const fencesOffset = p.device ? recordsEnd : 0;
  const releaseFencesOffset = p.device ? recordsEnd + fenceRow : 0;
  const totalBytes = p.device ? releaseFencesOffset + p.maxParticipants * fenceRow : recordsEnd;
  return {
    ...p, participantsOffset, ringOffset, slotRecordsOffset, slotRecordBytes, fencesOffset, releaseFencesOffset,
    releaseFenceRowBytes: p.device ? fenceRow : 0, totalBytes,
  };
}

/** Writes the header of a fresh (zeroed) block. */
export function writeHeader(view: DataView, l: Layout, expectProducers: number, expectConsumers: number): void {
  view.setUint32(H.magic, MAGIC, true);
  view.setUint16(H.version, VERSION, true);
  view.setUint16(H.headerBytes, HEADER_BYTES, true);
  view.setUint32(H.flags, (l.device ? FLAG_DEVICE : 0) | (l.broadcast ? FLAG_BROADCAST : 0), true);
  view.setUint32(H.slotCount, l.slotCount, true);
  view.setBigUint64(H.slotBytes, BigInt(l.slotBytes), true);
  view.setUint32(H.metaBytes, l.metaBytes, true);
  view.setUint32(H.maxParticipants, l.maxParticipants, true);
  view.setUint32(H.participantsOffset, l.participantsOffset, true);
  view.setUint32(H.ringOffset, l.ringOffset, true);
  view.setUint32(H.slotRecordsOffset, l.slotRecordsOffset, true);
  view.setUint32(H.slotRecordBytes, l.slotRecordBytes, true);
  view.setBigUint64(H.totalBytes, BigInt(l.totalBytes), true);
  view.setUint32(H.expectProducers, expectProducers, true);
  view.setUint32(H.expectConsumers, expectConsumers, true);
  view.setUint32(H.fencesOffset, l.fencesOffset, true);
}

/** Offset of slot s's publish fence. */
export const publishFence = (l: Layout, s: number): number => l.fencesOffset + s * 4;
/** Offset of participant k's release fence for slot s. */
export const releaseFence = (l: Layout, s: number, k: number): number => l.releaseFencesOffset + k * l.releaseFenceRowBytes + s * 4;

/**
 * Reads and checks the header of a received block `byteLength` bytes long: every field must
 * match what its own parameters imply. Throws ERR_DESCRIPTOR_INVALID / ERR_DESCRIPTOR_VERSION.
 */
export function readHeader(view: DataView, byteLength: number): HubLayout {
  const bad = (what: string) => new IpcError('ERR_DESCRIPTOR_INVALID', `received a channel control block that is not valid: ${what}`);
  if (byteLength < HEADER_BYTES) throw bad(`${byteLength} bytes, fewer than its ${HEADER_BYTES}-byte header`);
  if (view.getUint32(H.magic, true) !== MAGIC) throw bad('wrong magic number');
  const version = view.getUint16(H.version, true);
  if (version !== VERSION) {
    throw new IpcError('ERR_DESCRIPTOR_VERSION', `the peer's channel control block has layout version ${version}; this cuda-ipc reads version ${VERSION}: use the same cuda-ipc version on both sides`);
  }
  if (view.getUint16(H.headerBytes, true) !== HEADER_BYTES) throw bad('header size');
  const flags = view.getUint32(H.flags, true);
  if ((flags & ~(FLAG_DEVICE | FLAG_BROADCAST)) !== 0) throw bad(`unknown flags 0x${flags.toString(16)}`);
  const slotBytes = view.getBigUint64(H.slotBytes, true);
  if (slotBytes > BigInt(Number.MAX_SAFE_INTEGER)) throw bad('slot size');
  const params: LayoutParams = {
    slotCount: view.getUint32(H.slotCount, true),
    slotBytes: Number(slotBytes),
    metaBytes: view.getUint32(H.metaBytes, true),
    maxParticipants: view.getUint32(H.maxParticipants, true),
    device: (flags & FLAG_DEVICE) !== 0,
    broadcast: (flags & FLAG_BROADCAST) !== 0,
  };
  checkParams(params, 'ERR_DESCRIPTOR_INVALID');
  const l = computeLayout(params);
  const expect: Array<[number, number, string]> = [
    [view.getUint32(H.participantsOffset, true), l.participantsOffset, 'participants offset'],
    [view.getUint32(H.ringOffset, true), l.ringOffset, 'ring offset'],
    [view.getUint32(H.slotRecordsOffset, true), l.slotRecordsOffset, 'slot records offset'],
    [view.getUint32(H.slotRecordBytes, true), l.slotRecordBytes, 'slot record size'],
    [Number(view.getBigUint64(H.totalBytes, true)), l.totalBytes, 'total size'],
    [view.getUint32(H.fencesOffset, true), l.fencesOffset, 'fences offset'],
  ];
  for (const [got, want, what] of expect) if (got !== want) throw bad(`${what} ${got}, expected ${want}`);
  if (l.totalBytes > byteLength) throw bad(`it needs ${l.totalBytes} bytes but the shared memory holds ${byteLength}`);
  for (const [from, to] of RESERVED) {
    for (let i = from; i < to; i += 4) if (view.getUint32(i, true) !== 0) throw bad(`reserved header bytes at ${i} are not zero`);
  }
  const expectProducers = view.getUint32(H.expectProducers, true);
  const expectConsumers = view.getUint32(H.expectConsumers, true);
  if (expectProducers < 1 || expectProducers > l.maxParticipants || expectConsumers < 1 || expectConsumers > l.maxParticipants) throw bad('membership fields');
  return { ...l, expectProducers, expectConsumers };
}
