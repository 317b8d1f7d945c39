// The sync group's control messages (docs/PROTOCOL.md 9.3): plain link messages, a JSON object
// whose field `shard` names the kind. Everything a peer sends is parsed here, strictly: an unknown
// kind, a missing or mistyped field, a number out of range is IpcError ERR_SHARD_PROTOCOL (the
// receiver then closes the sender's link). Fields a message does not define are ignored (later
// versions may add some).
import { IpcError, type IpcErrorCode } from '../../errors.js';
import { NCCL_UNIQUE_ID_BYTES } from '../../nccl/unique-id.js';
import { MAX_LAYOUT_BYTES } from './layout-wire.js';
import { TensorMap } from '../tensor-map.js';
import type { Link } from '../../link/connection/link.js';

const U31 = 0x7fffffff;
/** Longest serve name / reason / message text a peer may send (characters). */
export const MAX_SHARD_TEXT = 4096;
/** Most ranks one group may have. */
export const MAX_SHARD_RANKS = 1 << 16;

/** member -> hub: this rank's layout (CISL) and where it serves its sources (null: it has none). */
export interface JoinMessage { readonly shard: 'join'; readonly rank: number; readonly layout: Uint8Array; readonly serve: string | null }
/** hub -> the joiner whose layout the hub refused (a LayoutError code, or ERR_SHARD_PROTOCOL). */
export interface RefusedMessage { readonly shard: 'refused'; readonly code: string; readonly message: string }
/** hub -> every rank: the group's layouts in rank order, their serve names, the NCCL chunk size. */
export interface PlanMessage {
  readonly shard: 'plan'; readonly epoch: number; readonly layouts: readonly Uint8Array[]; readonly serve: ReadonlyArray<string | null>; readonly chunkBytes: number;
  /** The hub's own rank (a member names it when its hub link drops); absent from hubs that do not say. */
  readonly hub?: number;
}
/** member -> hub: planned its pairs, holds its sources' mappings. */
export interface PlannedMessage { readonly shard: 'planned'; readonly epoch: number; readonly fingerprint: string; readonly nccl: boolean }
/** hub -> every rank: every rank planned the same; the NCCL communicator of the epoch, if any. */
export interface ReadyMessage {
  readonly shard: 'ready'; readonly epoch: number; readonly nccl: null | { readonly id: Uint8Array; readonly ranks: readonly number[] };
}
/** hub -> every rank: the epoch failed for a reason every rank shares (ERR_SHARD_PLAN: fingerprints differ). */
export interface FailedMessage { readonly shard: 'failed'; readonly epoch: number; readonly code: string; readonly message: string; readonly ranks: readonly number[] }
/** hub -> every other rank: `rank` is gone (its link dropped, it left). */
export interface LostMessage { readonly shard: 'lost'; readonly epoch: number; readonly rank: number; readonly reason: string }
/** dst -> src, first on a serve link: who connected, for which epoch. */
export interface HelloMessage { readonly shard: 'hello'; readonly epoch: number; readonly rank: number }
/** src -> dst on a serve link: the source's local tensors (a tensor set, by their layout names). */
export interface SourcesMessage { readonly shard: 'sources'; readonly epoch: number; readonly rank: number; readonly tensors: TensorMap }
/** src -> dst: the source's memory holds `version`. dst -> src (`done`): its copies of that sync landed. */
export interface GoMessage { readonly shard: 'go' | 'done'; readonly epoch: number; readonly version: number }

/** What the hub receives from a member. */
export type ToHub = JoinMessage | PlannedMessage;
/** What a member receives from the hub. */
export type FromHub = RefusedMessage | PlanMessage | ReadyMessage | FailedMessage | LostMessage;
/** What travels on a serve link (either way). */
export type OnServe = HelloMessage | SourcesMessage | GoMessage;
export type ShardMessage = ToHub | FromHub | OnServe;

function bad(what: string): never {
  throw new IpcError('ERR_SHARD_PROTOCOL', `a sharded group control message ${what}; the peer does not speak this protocol (PROTOCOL.md 9.3): its link is closed`);
}

function integer(o: Record<string, unknown>, key: string, min: number, max: number): number {
  const v = o[key];
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) bad(`has ${key} ${describe(v)}; it must be an integer ${min}..${max}`);
  return v;
}

function text(o: Record<string, unknown>, key: string, nullable = false): string {
  const v = o[key];
  if (nullable && v === null) return v as unknown as string;
  if (typeof v !== 'string' || v.length > MAX_SHARD_TEXT || (!nullable && key !== 'message' && key !== 'reason' && v.length === 0)) {
    bad(`has ${key} ${describe(v)}; it must be a string of at most ${MAX_SHARD_TEXT} characters${nullable ? ' or null' : ''}`);
  }
  return v;
}

function bytes(v: unknown, what: string, max: number): Uint8Array {
  if (!(v instanceof Uint8Array) || v.byteLength === 0 || v.byteLength > max) bad(`has ${what} ${describe(v)}; it must be 1..${max} bytes (a Uint8Array)`);
  return v;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (v === undefined) return 'missing';
  if (v instanceof Uint8Array) return `of ${v.byteLength} bytes`;
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v);
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return `of type ${Array.isArray(v) ? 'array' : typeof v}`;
}

/** Parses one control message; throws IpcError ERR_SHARD_PROTOCOL for anything that is not one. */
export function parseShardMessage(value: unknown): ShardMessage {
  if (value === null || typeof value !== 'object' || Array.isArray(value) || value instanceof Uint8Array || value instanceof TensorMap) bad(`is ${describe(value)}, not an object`);
  const o = value as Record<string, unknown>;
  switch (o.shard) {
    case 'join': {
      return { shard: 'join', rank: integer(o, 'rank', 0, U31), layout: bytes(o.layout, 'layout', MAX_LAYOUT_BYTES), serve: text(o, 'serve', true) };
    }
    case 'refused': {
      return { shard: 'refused', code: text(o, 'code'), message: text(o, 'message') };
    }
    case 'plan': {
      const epoch = integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER);
      if (!Array.isArray(o.layouts) || o.layouts.length === 0 || o.layouts.length > MAX_SHARD_RANKS) bad(`'plan' has layouts ${describe(o.layouts)}; it must be an array of 1..${MAX_SHARD_RANKS} records`);
      const layouts = (o.layouts as unknown[]).map((l, i) => bytes(l, `layouts[${i}]`, MAX_LAYOUT_BYTES));
      if (!Array.isArray(o.serve) || o.serve.length !== layouts.length) bad(`'plan' has serve ${describe(o.serve)}; it must be an array as long as layouts`);
      const serve = (o.serve as unknown[]).map((s, i) => text({ [`serve[${i}]`]: s }, `serve[${i}]`, true));
      const chunkBytes = integer(o, 'chunkBytes', 1, Number.MAX_SAFE_INTEGER);
      return { shard: 'plan', epoch, layouts, serve, chunkBytes, ...(o.hub !== undefined && { hub: integer(o, 'hub', 0, U31) }) };
    }
    case 'planned': {
      if (typeof o.nccl !== 'boolean') bad(`'planned' has nccl ${describe(o.nccl)}; it must be a boolean`);
      const fingerprint = text(o, 'fingerprint');
      if (!/^[0-9a-f]{64}$/.test(fingerprint)) bad(`'planned' has fingerprint ${describe(fingerprint)}; it must be 64 hex digits (SHA-256)`);
      return { shard: 'planned', epoch: integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER), fingerprint, nccl: o.nccl as boolean };
    }
    case 'ready': {
      const epoch = integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER);
      if (o.nccl === null) return { shard: 'ready', epoch, nccl: null };
      const n = o.nccl as Record<string, unknown>;
      if (n === undefined || typeof n !== 'object' || Array.isArray(n)) bad(`'ready' has nccl ${describe(n)}; it must be null or { id, ranks }`);
      const id = bytes(n.id, 'nccl.id', NCCL_UNIQUE_ID_BYTES);
      if (id.byteLength !== NCCL_UNIQUE_ID_BYTES) bad(`'ready' has an nccl.id of ${id.byteLength} bytes; an ncclUniqueId has ${NCCL_UNIQUE_ID_BYTES}`);
      return { shard: 'ready', epoch, nccl: { id, ranks: rankList(n.ranks, "'ready' nccl.ranks") } };
    }
    case 'failed': {
      return { shard: 'failed', epoch: integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER), code: text(o, 'code'), message: text(o, 'message'), ranks: rankList(o.ranks, "'failed' ranks", true) };
    }
    case 'lost': {
      return { shard: 'lost', epoch: integer(o, 'epoch', 0, Number.MAX_SAFE_INTEGER), rank: integer(o, 'rank', 0, U31), reason: text(o, 'reason') };
    }
    case 'hello': {
      return { shard: 'hello', epoch: integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER), rank: integer(o, 'rank', 0, U31) };
    }
    case 'sources': {
      if (!(o.tensors instanceof TensorMap)) bad(`'sources' has tensors ${describe(o.tensors)}; it must be a tensor set`);
      return { shard: 'sources', epoch: integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER), rank: integer(o, 'rank', 0, U31), tensors: o.tensors as TensorMap };
    }
    case 'go':
    case 'done': {
      return { shard: o.shard, epoch: integer(o, 'epoch', 1, Number.MAX_SAFE_INTEGER), version: integer(o, 'version', 1, Number.MAX_SAFE_INTEGER) };
    }
    default:
      return bad(o.shard === undefined ? 'has no field shard' : `has shard ${describe(o.shard)}, which no message of the group has`);
  }
}

/** Ranks as a message lists them: sorted, distinct integers. */
function rankList(v: unknown, what: string, allowEmpty = false): number[] {
  if (!Array.isArray(v) || (!allowEmpty && v.length === 0) || v.length > MAX_SHARD_RANKS) bad(`has ${what} ${describe(v)}; it must be an array of ranks`);
  const out = (v as unknown[]).map((r, i) => integer({ [`${what}[${i}]`]: r }, `${what}[${i}]`, 0, U31));
  for (let i = 1; i < out.length; i++) if (out[i]! <= out[i - 1]!) bad(`has ${what} not sorted or with a rank twice`);
  return out;
}

const REMOTE_CODES: ReadonlySet<string> = new Set<IpcErrorCode>([
  'ERR_LAYOUT_INVALID', 'ERR_LAYOUT_BOUNDS', 'ERR_LAYOUT_DTYPE', 'ERR_LAYOUT_SHAPE', 'ERR_LAYOUT_UNCOVERED', 'ERR_LAYOUT_OVERLAP',
  'ERR_SHARD_PROTOCOL', 'ERR_SHARD_PLAN', 'ERR_SHARD_PEER_LOST',
]);

/** The code a hub sent, as this side's IpcError code (one this side does not know: ERR_SHARD_PROTOCOL). */
export function remoteCode(code: string): IpcErrorCode {
  return REMOTE_CODES.has(code) ? code as IpcErrorCode : 'ERR_SHARD_PROTOCOL';
}

/** Sends `msg` unless the link is closed or closing (a peer gone is reported by the link's close, not here). */
export function trySend(link: Link, msg: ShardMessage): boolean {
  if (link.closed) return false;
  try {
    link.send(msg);
    return true;
  } catch {
    return false;
  }
}
