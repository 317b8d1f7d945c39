// `npm run bench [-- --iterations N] [--json FILE] [--no-python] [--no-handoff] [--no-channels]`: the project's benchmarks as a
// table (median, p99, comparison with the reference measured in the same run), optionally JSON.
import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { handoffBenchmarks } from './handoff.js';
import { pythonHandoffRefs } from './python-refs.js';
import { printTable, type Row, type Summary } from './stats.js';
import { channelBenchmarks, printChannelTables, TARGETS as CHANNEL_TARGETS, type ChannelResults } from './channel.js';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '2000' },
    warmup: { type: 'string', default: '300' },
    json: { type: 'string' },
    'no-python': { type: 'boolean', default: false },
    'no-handoff': { type: 'boolean', default: false },
    'no-channels': { type: 'boolean', default: false },
  },
});
const iterations = Number(values.iterations);
const warmup = Number(values.warmup);
if (!Number.isSafeInteger(iterations) || iterations < 1 || !Number.isSafeInteger(warmup) || warmup < 0) {
  console.error('bench: --iterations must be a positive integer and --warmup a non-negative one');
  process.exit(2);
}

const probe = probeDriver();
const gpu = probe.ok && Device.all().length > 0;
const device = gpu ? Device.get(0) : undefined;
console.log(`cuda-ipc benchmarks on ${hostname()}: ${device ? `${device.name} (CUDA driver ${probe.ok ? probe.version : '?'})` : 'no GPU (host buffers only)'}; Node ${process.version}`);
if (!values['no-handoff']) console.log(`handoff: a fresh 1 MiB buffer to a child that reads one value and acknowledges; ${iterations} timed after ${warmup} warm-up`);
const ours: Map<string, Summary> = values['no-handoff'] ? new Map() : await handoffBenchmarks(iterations, warmup, gpu);
const refs = gpu && !values['no-python'] && !values['no-handoff'] ? pythonHandoffRefs(iterations, warmup) : [];

const POOL = 'pool buffer (IPC pool)';
const POOL_TARGET_US = 30;
const rows: Row[] = [];
for (const [name, s] of ours) {
  const notes: string[] = [];
  if (name === POOL) {
    notes.push(`target median <= ${POOL_TARGET_US} us: ${s.median <= POOL_TARGET_US ? 'MET' : 'MISSED'}`);
    for (const r of refs) if (r.summary) notes.push(`${(r.summary.median / s.median).toFixed(1)}x faster than ${r.name.split(' ')[0]}`);
  }
  rows.push({ name, unit: 'us', median: s.median, p99: s.p99, n: s.n, notes });
}
for (const r of refs) {
  if (r.summary) rows.push({ name: `reference: ${r.name}`, unit: 'us', median: r.summary.median, p99: r.summary.p99, n: r.summary.n });
  else rows.push({ name: `reference: ${r.name}`, unit: 'us', median: NaN, notes: [`skipped: ${r.skipped}`] });
}
if (!values['no-handoff']) printTable('Handoff round trip (lower is better)', rows);

// Channels: after the handoff table.
let channels: ChannelResults | undefined;
if (!values['no-channels']) {
  channels = await channelBenchmarks(iterations, warmup, device);
  printChannelTables(channels, iterations, warmup, device);
}

if (values.json) {
  writeFileSync(values.json, JSON.stringify({
    host: hostname(), node: process.version, device: device?.toJSON() ?? null, iterations, warmup,
    handoff: Object.fromEntries(ours), references: refs,
    channels: channels ? { targets: CHANNEL_TARGETS, ...channels } : null,
  }, null, 2) + '\n');
  console.log(`\nwrote ${values.json}`);
}

// A measurement that was abandoned (timed out) may leave its child behind: do not wait for it.
process.exit(process.exitCode ?? 0);
