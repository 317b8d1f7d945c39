// Whether another process still runs, by pid: the one answer the channel's recovery, legacy
// handles and the CLI's waits share (a zombie is gone: its files and GPU contexts are closed).
import { readFileSync } from 'node:fs';

/** True once process `pid` has exited (a zombie counts). Unknown (0) counts as gone. */
export function processGone(pid: number): boolean {
  if (!pid) return true;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const state = stat.charAt(stat.lastIndexOf(')') + 2);
    return state === 'Z' || state === 'X';
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return true;
    return !processAlive(pid);
  }
}

/** True while a process `pid` exists (a zombie included; EPERM: it exists, owned by another user). */
export function processAlive(pid: number): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === 'EPERM';
  }
}
