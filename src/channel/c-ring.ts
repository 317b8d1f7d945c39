// The ring protocol's hot path through the C ring (native/py/channel_ring.c, the Python helper's,
// compiled into the addon too: native/c_ring.cc): one native call per claim, publish, take and
// release instead of the several SharedWords calls of slot-ring.ts, the same steps on the same
// control block, so ends on either ring (or a Python end) share a channel; broadcast's peek and
// held release too. Everything else (membership, recovery, stats) stays the JavaScript ring's,
// which this extends.
//
// Every end takes it by default: on the H200 machine it beat the JavaScript ring in every row the
// bench measures both ways, on host slots (round trips 0.77-0.90x the time, one way 1.15-1.30x the
// rate) and on device slots (spin round trip 0.85x, one way 1.02-1.10x, the rest the same), and it
// is the ring the Python ends run, so one implementation serves both languages. CUDA_IPC_CHANNEL_RING=js
// or =c, read when an end is made, chooses for every end; an addon built without the C ring serves
// with the JavaScript ring and says so once. The bench measures both side by side (bench/channel.ts).
import { IpcError } from '../errors.js';
import { addon } from '../native/addon.js';
import type { NativeCRing, NativeSharedWords } from '../native/channel-types.js';
import type { HubLayout } from './layout.js';
import { Ring, corrupt, type Bells, type PublishResult } from './slot-ring.js';

/** Result codes of the C ring (channel_ring.h). */
export const CIP = { NONE: -1, NOT_ALIVE: -2, CONSUMERS_GONE: -3, CORRUPT: -4, SKIP: -5, INVALID: -6, CLOSED: -100 } as const;
/** Flags of a take's result. */
export const CIP_TAKEN_DETACHED = 1 << 24;
export const CIP_TAKEN_BAD = 1 << 25;
const PUBLISHED: readonly PublishResult[] = ['ok', 'busy', 'dropped', 'detached'];
/** What a CIP_CORRUPT found (ERR_* of channel_ring.h), for the message. */
const CORRUPTION = ['', 'tail out of range', 'head out of range', '%a messages in a ring of %b slots', 'ring entry names slot %a of %b', '%a messages ahead of a consumer in a ring of %b slots'];

/** Which ring serves a channel end. */
export type RingKind = 'js' | 'c';
export const RING_ENV = 'CUDA_IPC_CHANNEL_RING';

/** The ring an end takes where CUDA_IPC_CHANNEL_RING is unset, on host and device slots alike: the
 * C ring where the addon has it, else the JavaScript ring. */
export function defaultRingKind(): RingKind {
  return cRingUnavailable() ? 'js' : 'c';
}

/** The last bad value of CUDA_IPC_CHANNEL_RING warned about (once per value). */
let badValueWarned: string | undefined;

/** The ring a new end takes: CUDA_IPC_CHANNEL_RING's ('c' or 'js') where it is
 * set, else defaultRingKind(). Any other value warns once (as the package's other variables
 * do, code CUDA_IPC_ENV) and the default holds. */
export function ringKindFor(): RingKind {
  const v = process.env[RING_ENV];
  if (v === 'c' || v === 'js') return v;
  if (v !== undefined && v !== '' && v !== badValueWarned) {
    badValueWarned = v;
    process.emitWarning(`${RING_ENV}=${JSON.stringify(v.slice(0, 64))} is not a ring (c: the C ring, js: the JavaScript ring); the default holds (the C ring where the addon has it)`, { code: 'CUDA_IPC_ENV' });
  }
  return defaultRingKind();
}

/** Why the C ring cannot serve here (the addon was built without it), or undefined when it can. */
export function cRingUnavailable(): string | undefined {
  return typeof addon.CRing === 'function' ? undefined : 'the native addon was built without the C ring (native/c_ring.cc): rebuild it (npm run build:native)';
}

let warned = false;
/** Says once that the C ring was chosen (by default or CUDA_IPC_CHANNEL_RING=c) and cannot serve. */
export function warnNoCRing(why: string): void {
  if (warned) return;
  warned = true;
  process.emitWarning(`cuda-ipc channel: the C ring cannot serve: ${why}; the JavaScript ring serves`, { code: 'CUDA_IPC_CHANNEL' });
}

export class CSlotRing extends Ring {
  readonly c: NativeCRing;
  readonly #out = new Float64Array(1);

  /** Participant `me`'s ring over the control block `fd` (borrowed), `bellFds` each participant's eventfd (borrowed: close() first). */
  constructor(words: NativeSharedWords, bytes: Uint8Array, layout: HubLayout, bells: Bells, me: number, fd: number, bellFds: readonly number[]) {
    super(words, bytes, layout, bells, me);
    const CRing = addon.CRing;
    if (typeof CRing !== 'function') throw new IpcError('ERR_NO_NATIVE_BUILD', cRingUnavailable()!);
    this.c = new CRing(fd, layout.totalBytes, {
      slotCount: layout.slotCount,
      maxParticipants: layout.maxParticipants,
      broadcast: layout.broadcast ? 1 : 0,
      participantsOffset: layout.participantsOffset,
      ringOffset: layout.ringOffset,
      slotRecordsOffset: layout.slotRecordsOffset,
      slotRecordBytes: layout.slotRecordBytes,
      metaBytes: layout.metaBytes,
      slotBytesLo: layout.slotBytes >>> 0,
      slotBytesHi: Math.floor(layout.slotBytes / 2 ** 32),
      expectConsumers: layout.expectConsumers,
    }, me, Int32Array.from(bellFds.slice(0, 32)), this.takenWords, this.#out);
  }

  /** A negative result that is not the expected "none": the typed error it means. */
  fail(code: number, what: string): Error {
    if (code === CIP.CORRUPT) {
      const [e, a, b] = this.c.error();
      return corrupt(`${what}: ${(CORRUPTION[e] ?? `error ${e}`).replace('%a', String(a)).replace('%b', String(b))}`);
    }
    if (code === CIP.CLOSED) return new IpcError('ERR_CHANNEL_CLOSED', `${what}: the channel is closed`);
    return new Error(`cuda-ipc internal: the C ring refused ${what} (result ${code})`);
  }

  /** cip_acquire: a slot, CIP.NONE (none free yet), or CIP.NOT_ALIVE / CONSUMERS_GONE / CORRUPT / CLOSED for the caller to say. */
  acquire(): number {
    return this.c.acquire();
  }

  override claimSlot(): number {
    const s = this.c.claim();
    if (s >= 0 || s === CIP.NONE) return s;
    throw this.fail(s, 'claim a slot');
  }

  override hasFree(): boolean {
    const r = this.c.hasFree();
    if (r < 0) throw this.fail(r, 'look for a free slot');
    return r === 1;
  }

  override discard(s: number): void {
    const r = this.c.discard(s);
    if (r < 0 && r !== CIP.CLOSED) throw this.fail(r, 'discard');
  }

  override publish(s: number): PublishResult {
    const r = this.c.publishWritten(s);
    const result = PUBLISHED[r];
    if (result === undefined) throw this.fail(r, 'publish');
    return result;
  }

  /** Whether this end was found detached right after its last take (the C take checks it). */
  override takeDetached: boolean | undefined = false;

  override take(): number {
    const r = this.c.take();
    if (r < 0) {
      if (r === CIP.NONE) return -1;
      throw this.fail(r, 'take');
    }
    const position = this.#out[0]!;
    if (position < 0) throw corrupt('a message position at or above 2^53');
    this.takenPosition = position;
    this.takeDetached = (r & CIP_TAKEN_DETACHED) !== 0;
    // CIP_TAKEN_BAD: the consumer reads the record and refuses it itself.
    return r & 0xffffff;
  }

  override releaseTaken(s: number): boolean {
    const r = this.c.release(s);
    if (r === 1 || r === 0) return r === 1;
    if (r === CIP.CLOSED) return false;
    throw this.fail(r, 'release');
  }

  override peekAt(cursor: number): number {
    const s = this.c.peek(cursor);
    if (s >= 0 || s === CIP.NONE) return s;
    if (s === CIP.SKIP) return -2;
    throw this.fail(s, 'peek');
  }

  override releaseHeld(s: number, k = this.me): boolean {
    const r = this.c.releaseHeld(s, k);
    if (r === 1 || r === 0) return r === 1;
    if (r === CIP.CLOSED) return false;
    throw this.fail(r, 'release');
  }

  override close(): void {
    this.c.detach();
  }
}
