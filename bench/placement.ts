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
  /** Every CPU of the node, as a list for taskset ("0,1,2,32"). */
  cpuList: string;
  /** Where the processes' other threads (GC, compiler, libuv) run: the node's CPUs less the cores
   * the main threads are pinned to and their hyperthreads, so that no helper thread preempts a
   * pinned main thread or shares its core (the whole node where too few are left). */
  helperList: string;
  /** How many of `cores` the main threads use (the bench process's and its children's). */
  reserved: number;
}

/** The most children one row runs at once (work sharing, 8 consumers). */
export const MAX_CHILDREN = 8;

/**
 * The CPUs for helper threads: `cpus` less the first `reserved` of `cores` and their hyperthread
 * siblings (`siblingsOf`); where fewer than 2 are left, less the reserved CPUs alone; where fewer
 * than 1 is left even so, every CPU.
 */
export function helperCpus(cpus: readonly number[], cores: readonly number[], reserved: number, siblingsOf: (cpu: number) => readonly number[]): number[] {
  const pinned = new Set(cores.slice(0, reserved));
  const busy = new Set<number>();
  for (const c of pinned) for (const s of [c, ...siblingsOf(c)]) busy.add(s);
  const free = cpus.filter((c) => !busy.has(c));
  if (free.length >= 2) return free;
  const unpinned = cpus.filter((c) => !pinned.has(c));
  return unpinned.length >= 1 ? unpinned : [...cpus];
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
  const cores = [...first, ...rest];
  // The bench process and up to MAX_CHILDREN children each on a physical core of its own where
  // the node has that many, and at least two CPUs left for the helper threads.
  const reserved = Math.max(2, Math.min(1 + MAX_CHILDREN, first.length - 2));
  const helpers = helperCpus(cpus, cores, Math.min(reserved, cores.length), siblingsFromSys);
  return { node, why, cores, cpuList: cpus.join(','), helperList: helpers.join(','), reserved: Math.min(reserved, cores.length) };
}

/**
 * `plan` with `first` at the head of its cores (--cpus): the bench's main thread on first[0], a row's
 * child on first[1], work-sharing children on the next ones; the helper threads recomputed around
 * them (`siblingsOf`: a CPU's hyperthreads). A VM's guest cannot see which vCPUs share a host core
 * or sit close on its mesh (issue 38: 0.05 us against 0.14-0.25 us a round trip on the H200
 * machine), so a pair probed outside the bench can be given here. Throws what was wrong with `first`.
 */
export function withCpusFirst(plan: PinPlan, first: readonly number[], siblingsOf: (cpu: number) => readonly number[] = siblingsFromSys): PinPlan {
  const cpus = parseCpuList(plan.cpuList);
  if (first.length < 2) throw new Error(`--cpus needs at least two CPUs (the bench's and a child's); got ${first.length}`);
  for (const c of first) {
    if (!cpus.includes(c)) throw new Error(`--cpus: CPU ${c} is not one of NUMA node ${plan.node}'s CPUs this process may use (${plan.cpuList})`);
  }
  if (new Set(first).size !== first.length) throw new Error(`--cpus: CPU ${first.find((c, i) => first.indexOf(c) !== i)} is named twice`);
  const cores = [...first, ...plan.cores.filter((c) => !first.includes(c))];
  const reserved = Math.max(plan.reserved, first.length);
  return { ...plan, why: `${plan.why}; --cpus ${first.join(',')} first`, cores, reserved, helperList: helperCpus(cpus, cores, reserved, siblingsOf).join(',') };
}

function siblingsFromSys(c: number): number[] {
  return parseCpuList(readText(`/sys/devices/system/cpu/cpu${c}/topology/thread_siblings_list`) ?? String(c));
}

/** The plan of a bench script's options: none with --no-pin, else pinPlan's, with --cpus's CPUs
 * first (`cpus`: "5,13"). Exits 2 saying what was wrong with --cpus. */
export function benchPinPlan(tool: string, noPin: boolean, cpus: string | undefined, pciBusId?: string): PinPlan | { skipped: string } {
  if (noPin) {
    if (cpus !== undefined) {
      console.error(`${tool}: --cpus and --no-pin contradict each other`);
      process.exit(2);
    }
    return { skipped: '--no-pin' };
  }
  const plan = pinPlan(pciBusId);
  if (cpus === undefined) return plan;
  if ('skipped' in plan) return { skipped: `${plan.skipped}; --cpus ${cpus} not applied` };
  const first = cpus.split(',').map((c) => c.trim());
  try {
    if (first.some((c) => !/^\d+$/.test(c))) throw new Error(`--cpus takes CPU numbers separated by commas, e.g. 5,13; got "${cpus}"`);
    return withCpusFirst(plan, first.map(Number));
  } catch (e) {
    console.error(`${tool}: ${(e as Error).message}`);
    process.exit(2);
  }
}

/** Pins process `pid`: every thread to `cpuList`, then its main thread to `cpu` (when given). False when taskset failed. */
export function pinProcess(pid: number, cpuList: string, cpu?: number): boolean {
  const all = spawnSync('taskset', ['-a', '-p', '-c', cpuList, String(pid)], { encoding: 'utf8' });
  const main = cpu === undefined ? all : spawnSync('taskset', ['-p', '-c', String(cpu), String(pid)], { encoding: 'utf8' });
  return all.status === 0 && main.status === 0;
}

/** A bench child: pins itself as its environment says (no-op without it); false when it was asked
 * to and taskset failed. */
export function pinFromEnv(): boolean {
  const cpu = Number(process.env[PIN_CPU_ENV]);
  const list = process.env[PIN_CPUS_ENV];
  if (process.env[PIN_CPU_ENV] && Number.isInteger(cpu) && cpu >= 0 && list) return pinProcess(process.pid, list, cpu);
  return true;
}

/** The CPUs this thread may run on (Cpus_allowed_list of /proc/thread-self/status), '?' where unknown. */
export function allowedCpus(): string {
  try {
    return readFileSync('/proc/thread-self/status', 'utf8').match(/^Cpus_allowed_list:\s*(.*)$/m)?.[1]?.trim() ?? '?';
  } catch {
    return '?';
  }
}

/** The CPU of the n-th child of a row: the cores after the bench process's, in turn, among the
 * reserved ones where there are enough. */
export function childCpu(plan: PinPlan, n = 0): number {
  const span = plan.reserved > 1 ? plan.reserved - 1 : plan.cores.length - 1;
  return plan.cores[1 + (n % span)]!;
}

/** Children's CPUs: the n-th child of a row on its core (childCpu), its other threads on the helper CPUs. */
export function childEnv(plan: PinPlan | undefined, n = 0): NodeJS.ProcessEnv {
  if (!plan) return process.env;
  return { ...process.env, [PIN_CPU_ENV]: String(childCpu(plan, n)), [PIN_CPUS_ENV]: plan.helperList };
}

/** Lists the plan: where each main thread goes and where the helper threads run. */
export function describePlan(plan: PinPlan): string {
  const kids = Array.from({ length: Math.min(MAX_CHILDREN, Math.max(1, plan.reserved - 1)) }, (_, i) => childCpu(plan, i));
  return `CPUs ${plan.cpuList} of NUMA node ${plan.node} (${plan.why}): the bench's main thread on CPU ${plan.cores[0]}, ` +
    `a row's child on CPU ${kids[0]}${kids.length > 1 ? ` (work sharing: ${kids.join(', ')})` : ''}, every other thread on CPUs ${plan.helperList}`;
}

/** Whether two CPUs are hyperthreads of one physical core. */
export function sameCore(a: number, b: number): boolean {
  if (a < 0 || b < 0 || a === b) return a === b && a >= 0;
  const list = readText(`/sys/devices/system/cpu/cpu${a}/topology/thread_siblings_list`);
  return list ? parseCpuList(list).includes(b) : false;
}

/** The pids of this process's live children (every thread's /proc/self/task/<tid>/children; Linux
 * 3.5+ with CONFIG_PROC_CHILDREN), or undefined where /proc does not list them. */
export function liveChildren(): number[] | undefined {
  try {
    const pids: number[] = [];
    for (const tid of readdirSync('/proc/self/task')) {
      const list = readFileSync(`/proc/self/task/${tid}/children`, 'utf8').trim();
      if (list) pids.push(...list.split(/\s+/).map(Number).filter((n) => Number.isInteger(n) && n > 0));
    }
    return pids;
  } catch {
    return undefined;
  }
}
