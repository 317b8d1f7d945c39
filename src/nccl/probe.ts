// Loading candidate NCCL libraries in a throw-away child process first (as vLLM's pynccl does):
// a library that aborts, faults or hangs when loaded takes down or stalls only the child, and the
// caller learns why. The child (probe-child.ts) tries the candidates in order and stops at the
// first that loads; one that kills it is recorded and the rest are tried in a new child.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** How one candidate fared in the probe. */
export type ProbeOutcome =
  | { ok: true; path: string; version: number }
  | { ok: false; code: string; message: string };

const CHILD = fileURLToPath(new URL('./probe-child.js', import.meta.url));
/** Loading a real libnccl maps a few hundred MB: seconds at worst. A minute means it hangs. */
export const PROBE_TIMEOUT_MS = 60_000;
const STDERR_KEPT = 2048;

/** Control characters of a child's output, made visible before they reach a message. */
export function printable(text: string): string {
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

interface ChildRun {
  outcomes: Map<number, ProbeOutcome>;
  /** The candidate being loaded when the child ended without reporting on it. */
  unfinished: number | undefined;
  death: string;
}

function runChild(paths: readonly string[], timeoutMs: number): Promise<ChildRun> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CHILD, ...paths], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.stdout.setEncoding('utf8').on('data', (s: string) => { stdout += s; });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { stderr = (stderr + s).slice(-STDERR_KEPT); });
    const finish = (death: string): void => {
      clearTimeout(timer);
      const outcomes = new Map<number, ProbeOutcome>();
      let trying: number | undefined;
      for (const line of stdout.split('\n')) {
        let msg: { trying?: number; ok?: boolean; path?: string; version?: number; code?: string; message?: string };
        try {
          msg = JSON.parse(line) as typeof msg;
        } catch {
          continue;  // a library may print on stdout while it loads
        }
        if (typeof msg.trying === 'number') {
          trying = msg.trying;
        } else if (trying !== undefined && msg.ok === true && typeof msg.path === 'string' && typeof msg.version === 'number') {
          outcomes.set(trying, { ok: true, path: msg.path, version: msg.version });
          trying = undefined;
        } else if (trying !== undefined && msg.ok === false) {
          outcomes.set(trying, { ok: false, code: String(msg.code), message: String(msg.message) });
          trying = undefined;
        }
      }
      const tail = printable(stderr.trim().split('\n').slice(-3).join(' | '));
      resolve({ outcomes, unfinished: trying, death: timedOut ? `it did not finish loading within ${timeoutMs} ms` : `${death}${tail ? ` (its stderr: ${tail})` : ''}` });
    };
    child.on('error', (e) => finish(`the probe process could not start: ${e.message}`));
    child.on('close', (code, signal) => finish(signal ? `loading it killed the probe process with ${signal}` : `the probe process exited with status ${code} while loading it`));
  });
}

/**
 * Loads `paths` in order in throw-away processes until one loads: one outcome per path tried (the
 * last is the success, if any). Never throws.
 */
export async function probeLibraries(paths: readonly string[], timeoutMs = PROBE_TIMEOUT_MS): Promise<ProbeOutcome[]> {
  const outcomes: ProbeOutcome[] = [];
  while (outcomes.length < paths.length) {
    const start = outcomes.length;
    const run = await runChild(paths.slice(start), timeoutMs);
    let advanced = false;
    for (let i = 0; start + i < paths.length; i++) {
      const o = run.outcomes.get(i);
      if (o) {
        outcomes.push(o);
        advanced = true;
        if (o.ok) return outcomes;
      } else {
        if (run.unfinished === i || !advanced) outcomes.push({ ok: false, code: 'ERR_PROBE', message: run.death });
        break;
      }
    }
  }
  return outcomes;
}
