// What links carried by value rather than by reference, per link and for the whole process: host
// memory copied into messages on TCP links ('host-bytes' records: the bytes cross the wire and
// arrive as a new buffer), and device memory moved over NCCL for a link (counted by the NCCL
// layer; 0 until it does). `stats()` and the status records read them. A leaf like hooks.ts:
// links describe themselves through TrafficLink, and nothing here imports them.
import { noteChange } from './hooks.js';

/** Bytes one link (or the process, all links together) carried by value. */
export interface LinkTraffic {
  /** Host memory copied into messages this side sent (HostBuffers on TCP links). */
  copiedSent: number;
  /** Host memory copied out of messages this side received (new HostBuffers it made). */
  copiedReceived: number;
  /** Device memory this side sent over NCCL for the link (0 until the NCCL layer counts it). */
  ncclSent: number;
  /** Device memory this side received over NCCL for the link. */
  ncclReceived: number;
}

/** A link as the counters know it. */
export interface TrafficLink {
  readonly id: number;
  /** Runs `hook` once when the link closes (at once if it is closed). */
  onClose(hook: () => void): unknown;
}

const zero = (): LinkTraffic => ({ copiedSent: 0, copiedReceived: 0, ncclSent: 0, ncclReceived: 0 });

const perLink = new WeakMap<object, LinkTraffic>();
/** Open links that carried something, for stats()' per-link list. */
const live = new Map<number, { link: WeakRef<TrafficLink>; traffic: LinkTraffic }>();
const total = zero();

/** Adds `bytes` to `field` of `link`'s counters and the process's. */
export function countTraffic(link: TrafficLink, field: keyof LinkTraffic, bytes: number): void {
  if (!(bytes > 0)) return;
  let t = perLink.get(link);
  if (!t) {
    const traffic = zero();
    perLink.set(link, (t = traffic));
    live.set(link.id, { link: new WeakRef(link), traffic });
    link.onClose(() => void live.delete(link.id));
  }
  t[field] += bytes;
  total[field] += bytes;
  noteChange(); // `cuda-ipc status` shows it
}

/** What `link` carried by value so far (zeros when nothing). */
export function linkTraffic(link: object): LinkTraffic {
  return { ...(perLink.get(link) ?? zero()) };
}

/** What every link of this process carried by value since it started, closed links included. */
export function processTraffic(): LinkTraffic {
  return { ...total };
}

/** The open links that carried something by value, with their counters. */
export function trafficByLink(): Array<{ linkId: number; traffic: LinkTraffic }> {
  const out: Array<{ linkId: number; traffic: LinkTraffic }> = [];
  for (const [id, e] of live) {
    if (!e.link.deref()) {
      live.delete(id);
      continue;
    }
    out.push({ linkId: id, traffic: { ...e.traffic } });
  }
  return out;
}
