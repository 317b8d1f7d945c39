// Where a process runs: the CPU it last ran on and that CPU's NUMA node, read from /proc and /sys
// (Linux). For the benchmarks' notes: two processes that talk through shared memory pay for every
// cache line that moves between their cores, and more across NUMA nodes.
import { readFileSync, readdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

/** The CPU this process last ran on (field 39 of /proc/self/stat), or -1 where it cannot be read. */
export function onCpu(): number {
  try {
    const stat = readFileSync('/proc/self/stat', 'utf8');
    // Fields after the command name (which may hold spaces) start at field 3.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const cpu = Number(fields[39 - 3]);
    return Number.isInteger(cpu) ? cpu : -1;
  } catch {
    return -1;
  }
}

/** The NUMA node of a CPU, or -1 where /sys does not say. */
export function nodeOf(cpu: number): number {
  if (cpu < 0) return -1;
  try {
    const link = readdirSync(`/sys/devices/system/cpu/cpu${cpu}`).find((n) => /^node\d+$/.test(n));
    return link ? Number(link.slice(4)) : -1;
  } catch {
    return -1;
  }
}

/** "CPUs 3 and 11 (one NUMA node)" or "CPUs 3 and 11 on NUMA nodes 0 and 1 of 0-1", for two
 * processes' CPUs. */
export function cpuPlacement(a: number, b: number): string {
  if (a < 0 || b < 0) return 'CPUs unknown';
  let online: string | undefined;
  try {
    online = readFileSync('/sys/devices/system/node/online', 'utf8').trim();
  } catch {
    // no NUMA information
  }
  const smt = a !== b && sameCore(a, b) ? ', hyperthreads of one core' : a === b ? ', the same CPU' : '';
  if (online === undefined) return `CPUs ${a} and ${b}${smt}`;
  if (online === '0') return `CPUs ${a} and ${b} (one NUMA node${smt})`;
  return `CPUs ${a} and ${b} on NUMA nodes ${nodeOf(a)} and ${nodeOf(b)} of ${online}${smt}`;
}

// ---------------------------------------------------------------------------------------------
// Pinning (issue 30): the two processes of a row on CPUs of one NUMA node (the GPU's, where there is
// one), each on a physical core of its own, so that one run decides and runs compare: the scheduler
// otherwise moves them between runs, onto hyperthreads of one core (which then share its execution
// units), or across nodes. The bench process pins itself at start; each child pins itself, at its
// start, to the CPU named in its environment (CUDA_IPC_BENCH_CPU), its other threads to the node's
// CPUs (CUDA_IPC_BENCH_CPUS). Node has no affinity call: `taskset` (util-linux) does it; Python
// children use os.sched_setaffinity. Where taskset is missing, nothing is pinned and the tables say so.
/** Environment variables a child reads to pin itself. */
export const PIN_CPU_ENV = 'CUDA_IPC_BENCH_CPU';
export const PIN_CPUS_ENV = 'CUDA_IPC_BENCH_CPUS';

export interface PinPlan {
  /** The NUMA node, and why that one. */
  node: number;
  why: string;
  /** Its CPUs, one per physical core first (the bench process takes cores[0], children the next ones). */
  cores: number[];
  /** Every CPU of the node, as a list for taskset ("0-15,32-47"). */
  cpuList: string;
}

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** "0-3,8" -> [0, 1, 2, 3, 8]. */
export function parseCpuList(list: string): number[] {
  const out: number[] = [];
  for (const part of list.split(',').map((p) => p.trim()).filter(Boolean)) {
    const [a, b] = part.split('-').map(Number);
    if (!Number.isInteger(a)) continue;
    for (let c = a!; c <= (Number.isInteger(b) ? b! : a!); c++) out.push(c);
  }
  return out;
}

/** What to pin to: the node of the GPU at `pciBusId` (or node 0), one CPU per physical core. */
export function pinPlan(pciBusId?: string): PinPlan | { skipped: string } {
  if (process.platform !== 'linux') return { skipped: `not Linux (${process.platform})` };
  if (spawnSync('taskset', ['-V'], { encoding: 'utf8' }).error) return { skipped: 'taskset (util-linux) is not installed' };
  let node = 0;
  let why = 'node 0';
  const gpuNode = pciBusId ? Number(readText(`/sys/bus/pci/devices/${pciBusId.toLowerCase()}/numa_node`)) : NaN;
  if (Number.isInteger(gpuNode) && gpuNode >= 0) {
    node = gpuNode;
    why = `the GPU's node (${pciBusId})`;
  }
  const cpuList = readText(`/sys/devices/system/node/node${node}/cpulist`) ?? readText('/sys/devices/system/cpu/online');
  if (!cpuList) return { skipped: 'no CPU list in /sys' };
  // Allowed CPUs only (a container may have fewer than the node).
  const allowed = new Set(parseCpuList(readText('/proc/self/status')?.match(/^Cpus_allowed_list:\s*(.*)$/m)?.[1] ?? cpuList));
  const cpus = parseCpuList(cpuList).filter((c) => allowed.has(c));
  if (cpus.length < 2) return { skipped: `node ${node} has ${cpus.length} CPU(s) this process may use` };
  // One CPU per physical core first, then the hyperthreads.
  const seen = new Set<string>();
  const first: number[] = [];
  const rest: number[] = [];
  for (const c of cpus) {
    const core = readText(`/sys/devices/system/cpu/cpu${c}/topology/thread_siblings_list`) ?? String(c);
    (seen.has(core) ? rest : first).push(c);
    seen.add(core);
  }
  return { node, why, cores: [...first, ...rest], cpuList: cpus.join(',') };
}

/** Pins process `pid`: every thread to `cpuList`, then its main thread to `cpu` (when given). False when taskset failed. */
export function pinProcess(pid: number, cpuList: string, cpu?: number): boolean {
  const all = spawnSync('taskset', ['-a', '-p', '-c', cpuList, String(pid)], { encoding: 'utf8' });
  const main = cpu === undefined ? all : spawnSync('taskset', ['-p', '-c', String(cpu), String(pid)], { encoding: 'utf8' });
  return all.status === 0 && main.status === 0;
}

/** A bench child: pins itself as its environment says (no-op without it). */
export function pinFromEnv(): void {
  const cpu = Number(process.env[PIN_CPU_ENV]);
  const list = process.env[PIN_CPUS_ENV];
  if (process.env[PIN_CPU_ENV] && Number.isInteger(cpu) && cpu >= 0 && list) pinProcess(process.pid, list, cpu);
}

/** Children's CPUs: the n-th child of a row on the core after the bench process's, in turn. */
export function childEnv(plan: PinPlan | undefined, n = 0): NodeJS.ProcessEnv {
  if (!plan) return process.env;
  const cpu = plan.cores[1 + (n % (plan.cores.length - 1))]!;
  return { ...process.env, [PIN_CPU_ENV]: String(cpu), [PIN_CPUS_ENV]: plan.cpuList };
}

/** Whether two CPUs are hyperthreads of one physical core. */
export function sameCore(a: number, b: number): boolean {
  if (a < 0 || b < 0 || a === b) return a === b && a >= 0;
  const list = readText(`/sys/devices/system/cpu/cpu${a}/topology/thread_siblings_list`);
  return list ? parseCpuList(list).includes(b) : false;
}
