// `npm run bench [-- --iterations N] [--json FILE] [--no-python] [--no-python-link] [--no-handoff] [--no-channels]`: the project's benchmarks as a
// table (median, p99, comparison with the reference measured in the same run), optionally JSON.
import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { handoffBenchmarks } from './handoff.js';
import { pythonHandoffRefs } from './python-refs.js';
import { printTable, type Row, type Summary } from './stats.js';
import { channelBenchmarks, channelRows, TARGETS as CHANNEL_TARGETS, type ChannelResults } from './channel.js';
import { pythonLinkBenchmarks, type PythonLinkResults } from './python-link.js';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '2000' },
    warmup: { type: 'string', default: '300' },
    json: { type: 'string' },
    'no-python': { type: 'boolean', default: false },
    'no-handoff': { type: 'boolean', default: false },
    'no-channels': { type: 'boolean', default: false },
    'no-python-link': { type: 'boolean', default: false },
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

// The Python companion (its own table; python3 with torch where there is a GPU).
const pythonLink: PythonLinkResults | undefined = values['no-python'] || values['no-python-link'] ? undefined : await pythonLinkBenchmarks(iterations, warmup, device);

// Channels: after the handoff table.
let channels: ChannelResults | undefined;
if (!values['no-channels']) {
  channels = await channelBenchmarks(iterations, warmup, device);
  const t = channelRows(channels);
  console.log(`\nchannels: ${device ? 'host and device slots' : 'host slots only (no GPU)'}; round trips ${iterations} timed after ${warmup} warm-up, ` +
    'one way and work sharing about 0.7 s each');
  printTable(`Channel round trip: a message to a child through one channel and back through another (targets: futex <= ${CHANNEL_TARGETS.rttFutexUs} us, spin <= ${CHANNEL_TARGETS.rttSpinUs} us)`, t.latency);
  printTable('Channel throughput (higher is better; one way: median of 2000-message batches, "p99" column = slowest 1% of batches)', t.throughput);
  if (t.kernel.length) printTable('Consumer kernel on shared slots (lower is better)', t.kernel);
}

if (values.json) {
  writeFileSync(values.json, JSON.stringify({
    host: hostname(), node: process.version, device: device?.toJSON() ?? null, iterations, warmup,
    handoff: Object.fromEntries(ours), references: refs, pythonLink: pythonLink ?? null,
    channels: channels ? { targets: CHANNEL_TARGETS, ...channels } : null,
  }, null, 2) + '\n');
  console.log(`\nwrote ${values.json}`);
}

// A measurement that was abandoned (timed out) may leave its child behind: do not wait for it.
process.exit(process.exitCode ?? 0);
