// Where a process runs: the CPU it last ran on and that CPU's NUMA node, read from /proc and /sys
// (Linux). For the benchmarks' notes: two processes that talk through shared memory pay for every
// cache line that moves between their cores, and more across NUMA nodes.
import { readFileSync, readdirSync } from 'node:fs';

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
  if (online === undefined) return `CPUs ${a} and ${b}`;
  if (online === '0') return `CPUs ${a} and ${b} (one NUMA node)`;
  return `CPUs ${a} and ${b} on NUMA nodes ${nodeOf(a)} and ${nodeOf(b)} of ${online}`;
}
