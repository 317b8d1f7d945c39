// Checks a parsed status record field by field before a reader uses it: a record is a file in a
// directory, and whatever wrote it (another version, a bug, another user where the directory was
// not private) may have written anything. A record that fails is skipped and named, never a
// TypeError that ends the whole listing. Strings are bounded here and escaped where printed
// (cli/terminal-text.ts).
import type { ImportCacheStats } from '../native/driver-types.js';
import type { ChannelPeerStatus, ChannelStatus, DeviceMemoryStats } from './reports.js';
import { MAX_LISTED, RECORD_VERSION, type LinkRecord, type StatusRecord } from './record.js';

/** Longest string a record may hold (argv entries are cut at 200 characters by the publisher). */
const MAX_STRING = 1024;
const MAX_ARGV = 64;
const MAX_PEERS = 4096;

class Unusable extends Error {}

function fail(where: string, what: string): never {
  throw new Unusable(`${where} is ${what}`);
}

type Obj = Record<string, unknown>;

function object(v: unknown, where: string): Obj {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) fail(where, 'not an object');
  return v as Obj;
}

function count(v: unknown, where: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) fail(where, 'not a count');
  return v;
}

function text(v: unknown, where: string): string {
  if (typeof v !== 'string' || v.length > MAX_STRING) fail(where, `not a string of at most ${MAX_STRING} characters`);
  return v;
}

function array(v: unknown, where: string, most: number): unknown[] {
  if (!Array.isArray(v)) fail(where, 'not an array');
  if (v.length > most) fail(where, `longer than ${most}`);
  return v;
}

function oneOf<T extends string>(v: unknown, where: string, values: readonly T[]): T {
  if (!values.includes(v as T)) fail(where, `not one of ${values.join(', ')}`);
  return v as T;
}

/** `{ key: count }` when o has the key, `{}` when not; `where` prefixes the name in messages. */
function optionalCount(o: Obj, key: string, where = ''): Obj {
  return o[key] === undefined ? {} : { [key]: count(o[key], `${where ? `${where}.` : ''}${key}`) };
}

function queue(v: unknown, where: string, withPaused: boolean): { messages: number; bytes: number; fds: number; paused?: boolean } {
  const o = object(v, where);
  const q = { messages: count(o.messages, `${where}.messages`), bytes: count(o.bytes, `${where}.bytes`), fds: count(o.fds, `${where}.fds`) };
  if (!withPaused) return q;
  if (typeof o.paused !== 'boolean') fail(`${where}.paused`, 'not true or false');
  return { ...q, paused: o.paused };
}

function link(v: unknown, where: string): LinkRecord {
  const o = object(v, where);
  const leased = object(o.leasedToPeer, `${where}.leasedToPeer`);
  const l: LinkRecord = {
    id: count(o.id, `${where}.id`),
    peerPid: count(o.peerPid, `${where}.peerPid`),
    state: oneOf(o.state, `${where}.state`, ['handshaking', 'open', 'closed'] as const),
    leasedToPeer: { count: count(leased.count, `${where}.leasedToPeer.count`), bytes: count(leased.bytes, `${where}.leasedToPeer.bytes`) },
    receivedFromPeer: count(o.receivedFromPeer, `${where}.receivedFromPeer`),
  };
  if (o.sendQueue !== undefined) l.sendQueue = queue(o.sendQueue, `${where}.sendQueue`, false);
  if (o.receiveQueue !== undefined) l.receiveQueue = queue(o.receiveQueue, `${where}.receiveQueue`, true) as LinkRecord['receiveQueue'];
  if (o.transport !== undefined) l.transport = oneOf(o.transport, `${where}.transport`, ['tcp'] as const);
  if (o.remote !== undefined) {
    const r = object(o.remote, `${where}.remote`);
    if (typeof r.tls !== 'boolean') fail(`${where}.remote.tls`, 'not true or false');
    const port = count(r.port, `${where}.remote.port`);
    if (port > 65535) fail(`${where}.remote.port`, 'not a port number');
    l.remote = { address: text(r.address, `${where}.remote.address`), port, family: text(r.family, `${where}.remote.family`), tls: r.tls };
  }
  if (o.traffic !== undefined) {
    const t = object(o.traffic, `${where}.traffic`);
    l.traffic = {
      copiedSent: count(t.copiedSent, `${where}.traffic.copiedSent`), copiedReceived: count(t.copiedReceived, `${where}.traffic.copiedReceived`),
      ncclSent: count(t.ncclSent, `${where}.traffic.ncclSent`), ncclReceived: count(t.ncclReceived, `${where}.traffic.ncclReceived`),
    };
  }
  return l;
}

const ROLES = ['producer', 'consumer', 'none'] as const;

function channelPeer(v: unknown, where: string): ChannelPeerStatus {
  const o = object(v, where);
  return { pid: count(o.pid, `${where}.pid`), role: oneOf(o.role, `${where}.role`, ROLES), state: text(o.state, `${where}.state`) };
}

function channel(v: unknown, where: string): ChannelStatus {
  const o = object(v, where);
  const s = object(o.slots, `${where}.slots`);
  return {
    id: text(o.id, `${where}.id`),
    role: oneOf(o.role, `${where}.role`, ROLES),
    ...(o.topology === undefined ? {} : { topology: text(o.topology, `${where}.topology`) }),
    memory: oneOf(o.memory, `${where}.memory`, ['host', 'device'] as const),
    slotBytes: count(o.slotBytes, `${where}.slotBytes`),
    slots: {
      free: count(s.free, `${where}.slots.free`),
      ...optionalCount(s, 'writing', `${where}.slots`),
      published: count(s.published, `${where}.slots.published`),
      taken: count(s.taken, `${where}.slots.taken`),
    },
    peers: array(o.peers, `${where}.peers`, MAX_PEERS).map((p, i) => channelPeer(p, `${where}.peers[${i}]`)),
  };
}

function device(v: unknown): DeviceMemoryStats {
  const o = object(v, 'device');
  const keys = ['allocations', 'allocatedBytes', 'leased', 'leasedBytes', 'heldBytes', 'imports', 'importedBytes'] as const;
  return Object.fromEntries(keys.map((k) => [k, count(o[k], `device.${k}`)])) as unknown as DeviceMemoryStats;
}

function importCache(v: unknown): ImportCacheStats {
  const o = object(v, 'importCache');
  const keys = ['mappings', 'idle', 'idleLimit', 'references', 'exports', 'opened'] as const;
  return Object.fromEntries(keys.map((k) => [k, count(o[k], `importCache.${k}`)])) as unknown as ImportCacheStats;
}

/**
 * The record `value` (parsed from the file `<pid>-<startTime>.json`) with every field checked and
 * nothing else kept, or why it cannot be used.
 */
export function checkRecord(value: unknown, pid: number, startTime: string): StatusRecord | string {
  try {
    const o = object(value, 'the record');
    if (o.version !== RECORD_VERSION) {
      return `written by another version of cuda-ipc (record version ${typeof o.version === 'number' ? o.version : 'missing'}, this one reads ${RECORD_VERSION})`;
    }
    if (o.pid !== pid || o.startTime !== startTime) return 'its pid or start time is not the one its name says';
    if (typeof o.updatedAt !== 'number' || !Number.isFinite(o.updatedAt) || Number.isNaN(new Date(o.updatedAt).getTime())) fail('updatedAt', 'not a time');
    const leases = object(o.leases, 'leases');
    return {
      version: RECORD_VERSION,
      pid,
      startTime,
      argv: array(o.argv, 'argv', MAX_ARGV).map((a, i) => text(a, `argv[${i}]`)),
      updatedAt: o.updatedAt,
      device: device(o.device),
      leases: { count: count(leases.count, 'leases.count'), bytes: count(leases.bytes, 'leases.bytes') },
      links: array(o.links, 'links', MAX_LISTED).map((l, i) => link(l, `links[${i}]`)),
      channels: array(o.channels, 'channels', MAX_LISTED).map((c, i) => channel(c, `channels[${i}]`)),
      ...optionalCount(o, 'linksNotListed'),
      ...optionalCount(o, 'channelsNotListed'),
      importCache: importCache(o.importCache),
      openFds: count(o.openFds, 'openFds'),
    } as StatusRecord;
  } catch (e) {
    if (e instanceof Unusable) return `not a status record: ${e.message}`;
    throw e;
  }
}
