// One-way channel throughput with a Python end, beside Node's rows of the same run (issue 18:
// a Python end should reach at least half of Node's one-way rate, host slots, both directions).
// Node -> Python: a Node producer and a Python consumer (bench/python/channel_oneway.py sink);
// Python -> Node: a Python producer and a Node consumer. Rates per batch of 2000 messages, timed on
// the Node side (the producer's publishes, or the consumer's receipts). The Python end says which
// hot path it ran (cuda_ipc.native_helper(): the C library, or the standard library alone).
import { fileURLToPath } from 'node:url';
import { spawnSync } from 'node:child_process';
import { spawnPython, pythonPackageDirectory } from '../src/link/index.js';
import { createChannel, type WaitMode } from '../src/channel/index.js';
import { ONE_WAY_WARMUP_MS, summarize, type Summary } from './stats.js';
import { cpuPlacement, onCpu } from './placement.js';
import { cpuOf, waitsOf, type WaitCounts } from './channel-floors.js';

const python = process.env.CUDA_IPC_PYTHON ?? 'python3';
const SCRIPT = fileURLToPath(new URL('../../bench/python/channel_oneway.py', import.meta.url));
const BATCH = 2000;
const LENGTH = 8;

export interface PythonOneWay {
  /** 'node->python batch': the Python consumer takes up to PYTHON_BATCH messages per call (receive_many);
   * 'python->node batch': the Python producer acquires and publishes up to PYTHON_BATCH per call (acquire_many, publish_many). */
  direction: 'node->python' | 'python->node' | 'node->python batch' | 'python->node batch';
  wait: WaitMode;
  slotBytes: number;
  msgsPerSec: Summary;
  slowest1pct: number;
  /** Per-batch rates. */
  rates: number[];
  cpuUsPerMsg: number;
  /** The Python process's CPU per message alone. */
  pythonCpuUsPerMsg: number;
  /** 'native (<library>)' or 'python (<why not native>)'. */
  hotPath: string;
  /** Where the two processes ran (CPUs; NUMA nodes). */
  placement: string;
  /** How each end's waits ended, per 1,000 messages (warm-up included): waits that the spin caught,
   * and sleeps on the doorbell (each costs the peer a ring and the sleeper a wake-up). On the H200
   * machine the slow runs were those where the Node end waited (spun) on nearly every message. */
  waitsPer1k: { node: WaitCounts; python: WaitCounts };
}

interface PythonReport { cpu: number; hot_path: string; native: string; waits?: { spin_hits?: number; sleeps?: number }; ranOn?: number }

/** Why Python rows cannot run here, or undefined when they can. */
export function pythonChannelUnavailable(): string | undefined {
  const r = spawnSync(python, ['-c', 'import cuda_ipc.channel'], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() } });
  if (r.error) return `${python} is not available (${r.error.message})`;
  if (r.status !== 0) return (r.stderr || r.stdout).trim().split('\n').pop() ?? `exit ${r.status}`;
  return undefined;
}

/** What the Node end measured besides the rates: its CPU time, its waits, the CPU it ran on. */
interface NodeSide { cpu: number; waits: WaitCounts; ranOn: number }

function result(direction: PythonOneWay['direction'], wait: WaitMode, slotBytes: number, rates: number[], mine: NodeSide, theirs: PythonReport, total: number): PythonOneWay {
  const sorted = rates.slice().sort((a, b) => a - b);
  const per1k = (n: number) => (n * 1000) / total;
  return {
    direction, wait, slotBytes, msgsPerSec: summarize(rates), slowest1pct: sorted[Math.floor(sorted.length * 0.01)]!, rates,
    cpuUsPerMsg: (mine.cpu + theirs.cpu) / total, pythonCpuUsPerMsg: theirs.cpu / total, hotPath: `${theirs.hot_path} (${theirs.native})`,
    placement: cpuPlacement(mine.ranOn, theirs.ranOn ?? -1),
    waitsPer1k: {
      node: { spinHits: per1k(mine.waits.spinHits), sleeps: per1k(mine.waits.sleeps) },
      python: { spinHits: per1k(theirs.waits?.spin_hits ?? 0), sleeps: per1k(theirs.waits?.sleeps ?? 0) },
    },
  };
}

/** A Node producer, a Python consumer, for about `ms`. */
/** The batch of the 'node->python batch' row's receive_many and of the 'python->node batch' row's acquire_many. */
export const PYTHON_BATCH = 64;

export async function nodeToPython(wait: WaitMode, slotBytes: number, slots: number, ms: number, env: NodeJS.ProcessEnv = process.env, batch = 0): Promise<PythonOneWay> {
  const { child, link } = await spawnPython(SCRIPT, ['sink', wait, ...(batch ? [String(batch)] : [])], { stdio: ['ignore', 'inherit', 'inherit'], env });
  const ch = await createChannel(link, { role: 'producer', slots, slotBytes, memory: 'host', wait });
  const rates: number[] = [];
  let total = 0;
  const mine: NodeSide = { cpu: 0, waits: { spinHits: 0, sleeps: 0 }, ranOn: -1 };
  try {
    const cpu0 = process.cpuUsage();
    // Untimed for ONE_WAY_WARMUP_MS first (CPU is counted over every message).
    const timed = performance.now() + ONE_WAY_WARMUP_MS;
    const end = timed + ms;
    while (performance.now() < end || rates.length < 5) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < BATCH; i++) {
        const slot = await ch.acquire();
        slot.bytes[0] = 1;
        ch.publish(slot, { length: LENGTH });
      }
      const t1 = process.hrtime.bigint();
      total += BATCH;
      if (performance.now() < timed) continue;
      rates.push(BATCH / (Number(t1 - t0) / 1e9));
      if (mine.ranOn < 0) mine.ranOn = onCpu();
    }
    await ch.end();
    mine.cpu = cpuOf(process.cpuUsage(cpu0));
  } finally {
    mine.waits = waitsOf(ch);
    if (!ch.closed) ch.close();
  }
  const r = (await link.receive({ timeout: 60_000 })) as PythonReport & { n: number; sum: number };
  await new Promise((resolve) => (child.exitCode !== null ? resolve(undefined) : child.once('exit', resolve)));
  if (r.n !== total || r.sum !== total) throw new Error(`Node -> Python one way: the Python consumer saw ${r.n} of ${total} messages (byte sum ${r.sum})`);
  return result(batch ? 'node->python batch' : 'node->python', wait, slotBytes, rates, mine, r, total);
}

/** A Python producer of `count` messages (`batch`: up to that many per acquire_many / publish_many), a Node consumer. */
export async function pythonToNode(wait: WaitMode, slotBytes: number, slots: number, count: number, env: NodeJS.ProcessEnv = process.env, batch = 0): Promise<PythonOneWay> {
  const { child, link } = await spawnPython(SCRIPT, ['source', wait, String(count), ...(batch ? [String(batch)] : [])], { stdio: ['ignore', 'inherit', 'inherit'], env });
  const ch = await createChannel(link, { role: 'consumer', slots, slotBytes, memory: 'host', wait });
  const rates: number[] = [];
  let n = 0;
  let sum = 0;
  const mine: NodeSide = { cpu: 0, waits: { spinHits: 0, sleeps: 0 }, ranOn: -1 };
  try {
    const cpu0 = process.cpuUsage();
    let t0 = process.hrtime.bigint();
    let timed = 0n;
    for await (const msg of ch) {
      sum += msg.bytes[0]!;
      msg.release();
      if (++n % BATCH === 0) {
        const t1 = process.hrtime.bigint();
        // The batches of the first ONE_WAY_WARMUP_MS (the first one includes the Python
        // producer's start) are left out; at least the last few count.
        if (n === BATCH) timed = t1 + BigInt(ONE_WAY_WARMUP_MS) * 1_000_000n;
        else if (t1 >= timed || count - n < 5 * BATCH) {
          rates.push(BATCH / (Number(t1 - t0) / 1e9));
          if (mine.ranOn < 0) mine.ranOn = onCpu();
        }
        t0 = t1;
      }
    }
    mine.cpu = cpuOf(process.cpuUsage(cpu0));
  } finally {
    mine.waits = waitsOf(ch);
    if (!ch.closed) ch.close();
  }
  const r = (await link.receive({ timeout: 60_000 })) as PythonReport;
  await new Promise((resolve) => (child.exitCode !== null ? resolve(undefined) : child.once('exit', resolve)));
  if (n !== count || sum !== count) throw new Error(`Python -> Node one way: the Node consumer saw ${n} of ${count} messages (byte sum ${sum})`);
  return result(batch ? 'python->node batch' : 'python->node', wait, slotBytes, rates, mine, r, count);
}
