// `cuda-ipc info`: what this machine offers for GPU sharing, as a table or JSON.
import { probeDriver } from '../cuda/driver.js';
import { Device, peerAccessMatrix, peerLinks } from '../cuda/device.js';
import { loadNccl, NcclUnavailableError, type NcclAttempt, type NcclSource } from '../nccl/index.js';

const GiB = 1024 ** 3;

export interface InfoReport {
  driverVersion: string | null;
  error: { code: string; message: string } | null;
  devices: Array<ReturnType<Device['toJSON']> & { freeMemory: number }>;
  peerAccess: boolean[][];
  /** Every directed pair of distinct devices, as cuDeviceGetP2PAttribute reports it (none with one device). */
  peers: PeerReport[];
  /** The NCCL library loadNccl() finds, or why there is none. */
  nccl: NcclReport;
}

/** NCCL as `cuda-ipc info` reports it: the library found, or the error and every place looked in. */
export type NcclReport =
  | { available: true; version: string; versionCode: number; path: string; source: NcclSource }
  | { available: false; error: { code: string; message: string }; attempts: NcclAttempt[] };

export interface PeerReport {
  from: number;
  to: number;
  fromUuid: string;
  toUuid: string;
  accessSupported: boolean;
  nativeAtomics: boolean;
  performanceRank: number;
}

function versionString(v: number): string {
  return `${Math.floor(v / 1000)}.${Math.floor((v % 1000) / 10)}`;
}

/** What loadNccl() finds; never throws. */
export async function collectNcclInfo(): Promise<NcclReport> {
  try {
    return { available: true, ...(await loadNccl()).toJSON() };
  } catch (err) {
    const e = err as Error & { code?: string };
    return { available: false, error: { code: e.code ?? 'ERROR', message: e.message }, attempts: err instanceof NcclUnavailableError ? [...err.attempts] : [] };
  }
}

export async function collectInfo(): Promise<InfoReport> {
  return { ...collectCudaInfo(), nccl: await collectNcclInfo() };
}

function collectCudaInfo(): Omit<InfoReport, 'nccl'> {
  const probe = probeDriver();
  if (!probe.ok) {
    const e = probe.error as Error & { code?: string };
    return { driverVersion: null, error: { code: e.code ?? 'ERROR', message: e.message }, devices: [], peerAccess: [], peers: [] };
  }
  try {
    const devices = Device.all();
    return {
      driverVersion: versionString(probe.version),
      error: null,
      devices: devices.map((d) => ({ ...d.toJSON(), freeMemory: d.memoryInfo().free })),
      peerAccess: peerAccessMatrix(devices),
      peers: peerLinks(devices).map((p) => ({
        from: p.from.ordinal, to: p.to.ordinal, fromUuid: p.from.uuid, toUuid: p.to.uuid,
        accessSupported: p.accessSupported, nativeAtomics: p.nativeAtomics, performanceRank: p.performanceRank,
      })),
    };
  } catch (err) {
    const e = err as Error & { code?: string };
    return { driverVersion: versionString(probe.version), error: { code: e.code ?? 'ERROR', message: e.message }, devices: [], peerAccess: [], peers: [] };
  }
}

const yesNo = (b: boolean) => (b ? 'yes' : 'no');

export function formatInfo(r: InfoReport): string {
  const lines: string[] = [];
  if (r.error) {
    lines.push(`CUDA: not available (${r.error.code})`);
    lines.push(`  ${r.error.message}`);
    lines.push('');
    lines.push('Host shared memory (HostBuffer), links and host-memory channels work without a GPU;');
    lines.push('sharing device memory needs an NVIDIA GPU and its driver on this machine.');
    lines.push('');
    lines.push(...formatNccl(r.nccl));
    return lines.join('\n');
  }
  lines.push(`CUDA driver: ${r.driverVersion}`);
  lines.push(`Devices: ${r.devices.length}`);
  for (const d of r.devices) {
    const c = d.capabilities;
    lines.push('');
    lines.push(`Device ${d.ordinal}: ${d.name}`);
    const rows: Array<[string, string]> = [
      ['UUID', d.uuid],
      ['compute capability', `${d.computeCapability.major}.${d.computeCapability.minor}`],
      ['memory', `${(d.totalMemory / GiB).toFixed(1)} GiB total, ${(d.freeMemory / GiB).toFixed(1)} GiB free`],
      ['PCI bus id', d.pciBusId],
      ['multiprocessors', String(d.multiprocessors)],
      ['legacy IPC handles', yesNo(c.legacyIpc)],
      ['memory pools', yesNo(c.memoryPools)],
      ['POSIX-fd pool handles', yesNo(c.posixFdPoolHandles)],
      ['fabric pool handles', yesNo(c.fabricPoolHandles)],
      ['IPC events', yesNo(c.ipcEvents)],
      ['stream memory operations', `${yesNo(c.streamMemOps)}${c.streamMemOps64 ? ' (64-bit too)' : ''}`],
      ['unified addressing', yesNo(c.unifiedAddressing)],
      ['managed memory', yesNo(c.managedMemory)],
    ];
    const w = Math.max(...rows.map(([k]) => k.length));
    for (const [k, v] of rows) lines.push(`  ${k.padEnd(w)}  ${v}`);
  }
  lines.push('');
  lines.push(...formatPeers(r));
  lines.push('');
  lines.push(...formatNccl(r.nccl));
  return lines.join('\n');
}

/** The NCCL lines: version and file, or why none was found and where it looked. */
export function formatNccl(n: NcclReport): string[] {
  if (n.available) return [`NCCL: ${n.version} (${n.path}, found ${NCCL_SOURCES[n.source]})`];
  const lines = [`NCCL: not available (${n.error.code})`];
  if (n.attempts.length === 0) return [...lines, `  ${n.error.message}`];
  for (const a of n.attempts) lines.push(`  ${NCCL_SOURCES[a.source]}: ${a.path}: ${a.error}`);
  lines.push('  Moving device memory between machines needs NCCL 2.14 or newer; name the file with CUDA_IPC_NCCL_LIBRARY.');
  return lines;
}

const NCCL_SOURCES: Record<NcclSource, string> = {
  option: 'at the path given',
  env: 'by CUDA_IPC_NCCL_LIBRARY',
  system: 'on the system\'s library path',
  wheel: 'in PyTorch\'s wheel',
};

/** The peer table: one row per directed pair of devices (cuDeviceGetP2PAttribute). */
export function formatPeers(r: Pick<InfoReport, 'devices' | 'peers'>): string[] {
  if (r.devices.length < 2) return [`Peer links: none (${r.devices.length} device${r.devices.length === 1 ? '' : 's'}; peer IPC needs two GPUs)`];
  const head = ['from', 'to', 'access', 'native atomics', 'performance rank'];
  const rows = r.peers.map((p) => [String(p.from), String(p.to), yesNo(p.accessSupported), yesNo(p.nativeAtomics), String(p.performanceRank)]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  const line = (cells: string[]) => '  ' + cells.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd();
  return ['Peer links (kernels on "from" using memory of "to"):', line(head), ...rows.map(line)];
}
