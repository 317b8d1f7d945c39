// `cuda-ipc status`: who holds what, across the processes of this user that use cuda-ipc.
import { statSync } from 'node:fs';
import { basename } from 'node:path';
import { collectStatus, type PeerShare, type ProcessStatus, type StatusSnapshot } from '../observe/reader.js';
import type { LinkRecord } from '../observe/record.js';
import type { ChannelStatus } from '../observe/hooks.js';
import { stringValue, UsageError, type ParsedArgs } from './args.js';
import { terminalSafe, terminalSafeJson } from './terminal-text.js';

export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v >= 100 ? v.toFixed(0) : v.toFixed(1)} ${units[u]}`;
}

const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** `node dist/app.js --x`: the executable's base name, then the arguments as given. */
export function commandLine(argv: readonly string[]): string {
  if (argv.length === 0) return '?';
  return [basename(argv[0]!), ...argv.slice(1)].join(' ');
}

/**
 * `s` safe to print on a terminal: control characters (C0, DEL, C1) as \xNN, at most `max`
 * characters. Records are files any process of this user may write.
 */
export function printable(s: unknown, max = 100): string {
  const t = String(s);
  const cut = t.length > max ? `${t.slice(0, max)}...` : t;
  return cut.replace(/[\x00-\x1f\x7f-\x9f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

/** Where the peer of a TCP link is, as `tcp 10.0.0.2:5000` (`tls [::1]:5000`). */
function remoteText(l: LinkRecord): string {
  const r = l.remote;
  if (!r) return 'tcp, peer unknown';
  const address = printable(r.address, 64);
  return `${r.tls ? 'tls' : 'tcp'} ${r.family === 'IPv6' ? `[${address}]` : address}:${printable(r.port, 8)}`;
}

/** Who is at the other end of `l`: a pid, a TCP address, or nobody yet. */
function peerText(l: LinkRecord): string {
  return l.transport === 'tcp' ? remoteText(l) : l.peerPid ? `pid ${l.peerPid}` : 'peer not known yet';
}

function bytesOrZero(n: unknown): string {
  return typeof n === 'number' && Number.isSafeInteger(n) && n >= 0 ? formatBytes(n) : '?';
}

function share(s: PeerShare): string {
  return `pid ${s.pid}: ${plural(s.count, 'lease')}${s.bytes === null ? ' (size unknown: that process publishes no record)' : `, ${formatBytes(s.bytes)}`}`;
}

function channelLines(c: ChannelStatus): string[] {
  const s = c.slots;
  const total = s.free + (s.writing ?? 0) + s.published + s.taken;
  const states = [`${s.free} free`, ...(s.writing !== undefined ? [`${s.writing} writing`] : []), `${s.published} published`, `${s.taken} taken`];
  const lines = [`${c.id}: ${c.role}${c.topology ? `, ${c.topology}` : ''}, ${c.memory} memory, ${total} x ${formatBytes(c.slotBytes)}: ${states.join(', ')}`];
  if (c.peers.length) lines.push(`  peers: ${c.peers.map((p) => `pid ${p.pid} ${p.role} ${p.state}`).join(', ')}`);
  return lines;
}

/** The lines of one process: a title, then labelled rows (empty ones left out). */
export function processLines(p: ProcessStatus): string[] {
  const rows: Array<[string, string[]]> = [];
  const d = p.device;
  const device: string[] = [];
  if (d.allocations > 0) {
    let line = `${plural(d.allocations, 'allocation')}, ${formatBytes(d.allocatedBytes ?? 0)}`;
    if (d.leased > 0) line += `; peers lease ${d.leased} of them (${formatBytes(d.leasedBytes)})`;
    if (d.heldBytes > 0) line += `, ${formatBytes(d.heldBytes)} kept only for peers`;
    device.push(line);
  }
  if (d.imports > 0) device.push(`mapped from other processes: ${plural(d.imports, 'allocation')}, ${formatBytes(d.importedBytes)}`);
  if (device.length) rows.push(['device', device]);
  if (p.leasedTo.length) rows.push(['leased to', p.leasedTo.map(share)]);
  if (p.importedFrom.length) rows.push(['holds from', p.importedFrom.map(share)]);
  if (p.links.length) {
    const links = p.links.map((l) => `#${l.id} ${peerText(l)} ${printable(l.state, 16)}`);
    const more = p.linksNotListed ? ` and ${p.linksNotListed} more` : '';
    rows.push(['links', [`${p.links.length} open${more}: ${links.join(', ')}`]]);
    // A peer that stopped reading shows here: what waits for it, and what waits for us.
    const backlog: string[] = [];
    // Links between machines: what they copied (host memory) and moved over NCCL (device memory).
    const tcp = p.links.filter((l) => l.transport === 'tcp').map((l) => {
      const t = l.traffic;
      return `#${l.id} ${remoteText(l)}: host memory copied ${bytesOrZero(t?.copiedSent)} sent, ${bytesOrZero(t?.copiedReceived)} received; ` +
        `device memory over NCCL ${bytesOrZero(t?.ncclSent)} sent, ${bytesOrZero(t?.ncclReceived)} received`;
    });
    if (tcp.length) rows.push(['over TCP', tcp]);
    for (const l of p.links) {
      const who = `#${l.id}${l.transport === 'tcp' ? ` (${remoteText(l)})` : l.peerPid ? ` (pid ${l.peerPid})` : ''}`;
      const q = l.sendQueue;
      if (q && q.messages > 0) backlog.push(`${who}: ${plural(q.messages, 'message')} (${formatBytes(q.bytes)}, ${plural(q.fds, 'fd')}) queued to send: the peer is not reading`);
      const r = l.receiveQueue;
      if (r && (r.messages > 0 || r.paused)) {
        backlog.push(`${who}: ${plural(r.messages, 'message')} (${formatBytes(r.bytes)}) received, not yet consumed${r.paused ? '; reading paused until they are' : ''}`);
      }
    }
    if (backlog.length) rows.push(['backlog', backlog]);
  }
  for (const c of p.channels) rows.push(['channel', channelLines(c)]);
  const cache = p.importCache;
  if (cache.mappings > 0 || cache.exports > 0) {
    rows.push(['legacy IPC', [`${plural(cache.exports, 'export')}; import cache: ${plural(cache.mappings, 'mapping')} (${cache.idle} idle of at most ${cache.idleLimit})`]]);
  }
  if (rows.length === 0) rows.push(['shares', ['nothing now']]);
  rows.push(['fds', [`${p.openFds} open`]]);
  const w = Math.max(...rows.map(([k]) => k.length));
  const age = p.ageMs < 1000 ? 'just now' : `${(p.ageMs / 1000).toFixed(p.ageMs < 10_000 ? 1 : 0)} s ago`;
  const out = [`pid ${p.pid}  ${commandLine(p.argv)}   (last change ${age})`];
  for (const [k, lines] of rows) {
    lines.forEach((line, i) => out.push(`  ${(i === 0 ? k : '').padEnd(w)}  ${line}`));
  }
  return out;
}

export function formatStatus(s: StatusSnapshot): string[] {
  const out: string[] = [];
  const n = s.processes.length;
  out.push(n === 0
    ? `No process of this user publishes a cuda-ipc status record (records: ${s.directory}).`
    : `${plural(n, 'process', 'processes')} using cuda-ipc (records: ${s.directory})`);
  if (n === 0) out.push('Processes publish one while they have links or device memory, unless CUDA_IPC_STATUS=0.');
  for (const p of s.processes) out.push('', ...processLines(p));
  if (s.stale.length) {
    const shown = s.stale.slice(0, 10).map((p) => `pid ${p}`).join(', ');
    const more = s.stale.length > 10 ? ` and ${s.stale.length - 10} more` : '';
    out.push('', `Removed the records of ${plural(s.stale.length, 'process', 'processes')} that are gone (killed or crashed): ${shown}${more}.`);
  }
  for (const u of s.unreadable) out.push('', `Could not use the record ${u.file}: ${u.reason}.`);
  // Everything above may hold text from a record: printed as is, it could drive the terminal.
  return out.map(terminalSafe);
}

/** The `--dir` a user gave, checked; undefined for the default. */
export function directoryOption(args: ParsedArgs): string | undefined {
  const dir = stringValue(args, 'dir');
  if (dir === undefined) return undefined;
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    // reported below
  }
  if (!isDir) throw new UsageError(`--dir ${dir} is not a directory; give the folder that holds the records (by default the status/ folder of the socket directory)`);
  return dir;
}

export function status(args: ParsedArgs): number {
  const snapshot = collectStatus({ directory: directoryOption(args) });
  console.log(args.values.json ? terminalSafeJson(JSON.stringify(snapshot, null, 2)) : formatStatus(snapshot).join('\n'));
  return 0;
}
