// Finding and loading NCCL: loadNccl() probes the candidates of discovery.ts in a throw-away
// process (probe.ts), then loads the first that loaded there, by the path the loader chose.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { nccl } from './native.js';
import { NcclError, NcclResult, NcclUnavailableError, type NcclAttempt } from './errors.js';
import { NCCL_LIBRARY_ENV, SYSTEM_NCCL, chosenCandidate, pythonFor, wheelLibraries, type NcclCandidate, type NcclSource } from './discovery.js';
import { PROBE_TIMEOUT_MS, probeLibraries } from './probe.js';
import { NCCL_UNIQUE_ID_BYTES, type NcclUniqueId } from './unique-id.js';
import { checkObject, invalidArgType, received } from '../arg-errors.js';

/** Options of loadNccl. */
export interface LoadNcclOptions {
  /** The library file to load (e.g. '/opt/nccl/lib/libnccl.so.2'); nothing else is tried. Else
   * $CUDA_IPC_NCCL_LIBRARY, alone too; else the system's libnccl.so.2, then PyTorch's wheel. */
  path?: string;
  /** The Python interpreter asked where PyTorch's wheel put NCCL: default $CUDA_IPC_PYTHON, else python3. */
  python?: string;
}

/**
 * A loaded NCCL library (libnccl.so.2): `await loadNccl()`. Loaded for the life of the process;
 * the same object for the same file.
 */
export class NcclLibrary {
  /** The file loaded, as the dynamic loader resolved it. */
  readonly path: string;
  /** NCCL's version, e.g. '2.28.9'. */
  readonly version: string;
  /** ncclGetVersion's code, e.g. 22809. */
  readonly versionCode: number;
  /** Where it was found: 'option', 'env' (CUDA_IPC_NCCL_LIBRARY), 'system' or 'wheel' (PyTorch's). */
  readonly source: NcclSource;
  /** @internal The addon's index of the library. */
  readonly id: number;

  /** @internal */
  constructor(id: number, path: string, versionCode: number, source: NcclSource) {
    this.id = id;
    this.path = path;
    this.versionCode = versionCode;
    this.version = formatNcclVersion(versionCode);
    this.source = source;
  }

  /**
   * A new unique id (ncclGetUniqueId) for one communicator: made by one rank (it also opens the
   * socket NCCL's bootstrap listens on) and sent to the others, who pass it to
   * NcclCommunicator.init. Throws NcclError (ERR_NCCL).
   */
  uniqueId(): NcclUniqueId {
    const id = new Uint8Array(NCCL_UNIQUE_ID_BYTES);
    const r = nccl.ncclGetUniqueId(this.id, id);
    if (r !== NcclResult.ncclSuccess) throw this.error(r, 'ncclGetUniqueId');
    return id as NcclUniqueId;
  }

  /** @internal The NcclError of `result` from `call` (on `comm`, when one is concerned). */
  error(result: number, call: string, comm = 0n): NcclError {
    let lastError = '';
    try {
      lastError = nccl.ncclGetLastError(this.id, comm);
    } catch {
      lastError = nccl.ncclGetLastError(this.id, 0n);  // the communicator is gone already
    }
    return new NcclError(result, call, nccl.ncclGetErrorString(this.id, result), lastError);
  }

  /** The library as plain data (what `cuda-ipc info --json` prints). */
  toJSON(): { path: string; version: string; versionCode: number; source: NcclSource } {
    return { path: this.path, version: this.version, versionCode: this.versionCode, source: this.source };
  }
}

/**
 * NCCL's version code as text: NCCL_VERSION(X, Y, Z) is X*1000 + Y*100 + Z up to 2.8 and
 * X*10000 + Y*100 + Z since 2.9 (22809 is 2.28.9, 2804 is 2.8.4).
 */
export function formatNcclVersion(code: number): string {
  if (!Number.isInteger(code) || code < 0) return `unknown (${code})`;
  const major = code >= 10000 ? Math.floor(code / 10000) : Math.floor(code / 1000);
  const minor = code >= 10000 ? Math.floor((code % 10000) / 100) : Math.floor((code % 1000) / 100);
  return `${major}.${minor}.${code % 100}`;
}

const libraries = new Map<number, NcclLibrary>();  // by the addon's index: one object per file
const loading = new Map<string, Promise<NcclLibrary>>();  // in flight or loaded, by what was asked

/**
 * Finds and loads NCCL: the path given (only it), else the file $CUDA_IPC_NCCL_LIBRARY names
 * (only it), else the system's libnccl.so.2, else PyTorch's wheel copy (nvidia/nccl/lib under
 * python3's site-packages; torch is not imported). Each candidate is first loaded in a throw-away
 * process, so one that crashes when loaded cannot take this process down. Rejects with
 * NcclUnavailableError (IpcError ERR_NCCL_UNAVAILABLE), whose message and `attempts` name every
 * place looked in and why each failed. A loaded library is remembered: later calls answer at once.
 *
 * Every rank of a communicator must load the same NCCL version (NCCL refuses mixed versions): a
 * Python process that imported torch has torch's copy loaded already, so name that one in both
 * (CUDA_IPC_NCCL_LIBRARY) when Node and PyTorch share a communicator.
 */
export async function loadNccl(options?: LoadNcclOptions): Promise<NcclLibrary> {
  checkObject(options, 'options');
  const path = options?.path;
  if (path !== undefined && (typeof path !== 'string' || path === '')) {
    throw invalidArgType(`The "options.path" property must be a non-empty string. ${received(path)}`);
  }
  const python = options?.python;
  if (python !== undefined && (typeof python !== 'string' || python === '')) {
    throw invalidArgType(`The "options.python" property must be a non-empty string. ${received(python)}`);
  }
  const chosen = chosenCandidate(path);
  const key = chosen ? `${chosen.source}:${chosen.path}` : `auto:${pythonFor(python)}`;
  let p = loading.get(key);
  if (!p) {
    p = discover(chosen, pythonFor(python));
    loading.set(key, p);
    p.catch(() => loading.delete(key));  // failures are looked into again next time
  }
  return await p;
}

/**
 * The NCCL library this process loaded first, if any (no search, no wait): what a synchronous
 * caller (a link's send) uses. undefined until some loadNccl() resolved.
 */
export function loadedNcclLibrary(): NcclLibrary | undefined {
  return libraries.values().next().value;
}

const DISCOVER_CHILD = fileURLToPath(new URL('./discover-child.js', import.meta.url));

/**
 * loadNccl() for a caller that cannot wait (a link's send: its first NCCL record must carry a unique
 * id): the library loaded already, else the search runs in a child process while this one waits
 * (once per process; `await loadNccl()` beforehand avoids the wait). Throws NcclUnavailableError.
 */
export function loadNcclSync(): NcclLibrary {
  const loaded = loadedNcclLibrary();
  if (loaded) return loaded;
  const r = spawnSync(process.execPath, [DISCOVER_CHILD], { encoding: 'utf8', timeout: 2 * PROBE_TIMEOUT_MS, maxBuffer: 1 << 20 });
  let answer: { ok?: boolean; path?: unknown; source?: unknown; message?: unknown; attempts?: unknown } | undefined;
  for (const line of (r.stdout ?? '').split('\n')) {
    try {
      answer = JSON.parse(line) as typeof answer;
    } catch {
      // a library may print while it loads
    }
  }
  if (answer?.ok === true && typeof answer.path === 'string' && typeof answer.source === 'string') {
    return open(answer.path, answer.source as NcclSource);
  }
  if (answer?.ok === false) throw new NcclUnavailableError(String(answer.message), Array.isArray(answer.attempts) ? answer.attempts as NcclAttempt[] : []);
  throw new NcclUnavailableError(`the search for NCCL failed: its process ${r.error ? `could not run (${r.error.message})` : `ended with ${r.signal ?? `status ${r.status}`}`}`, []);
}

/** @internal Forgets what loadNccl found (tests change the environment it searches); libraries stay loaded. */
export function forgetDiscoveries(): void {
  loading.clear();
}

async function discover(chosen: NcclCandidate | undefined, python: string): Promise<NcclLibrary> {
  const attempts: NcclAttempt[] = [];
  const tryAll = async (candidates: NcclCandidate[]): Promise<NcclLibrary | undefined> => {
    const outcomes = await probeLibraries(candidates.map((c) => c.path));
    for (let i = 0; i < outcomes.length; i++) {
      const o = outcomes[i]!;
      const c = candidates[i]!;
      if (!o.ok) {
        attempts.push({ source: c.source, path: c.path, error: o.message });
        continue;
      }
      try {
        return open(o.path, c.source);
      } catch (e) {
        attempts.push({ source: c.source, path: o.path, error: `it loaded in the probe process but not here: ${(e as Error).message}` });
      }
    }
    return undefined;
  };
  if (chosen) {
    const lib = await tryAll([chosen]);
    if (lib) return lib;
    throw unavailable(attempts);
  }
  const system = await tryAll([{ source: 'system', path: SYSTEM_NCCL }]);
  if (system) return system;
  const wheels = await wheelLibraries(python);
  if (wheels.paths.length === 0) {
    attempts.push({ source: 'wheel', path: `nvidia/nccl/lib/${SYSTEM_NCCL} in ${python}'s site-packages`, error: wheels.why });
  } else {
    const wheel = await tryAll(wheels.paths.map((p) => ({ source: 'wheel' as const, path: p })));
    if (wheel) return wheel;
  }
  throw unavailable(attempts);
}

function open(path: string, source: NcclSource): NcclLibrary {
  const opened = nccl.ncclOpen(path);
  let lib = libraries.get(opened.library);
  if (!lib) {
    lib = new NcclLibrary(opened.library, opened.path, opened.version, source);
    libraries.set(opened.library, lib);
  }
  return lib;
}

const PLACES: Record<NcclSource, string> = {
  option: 'the path given (options.path)',
  env: NCCL_LIBRARY_ENV,
  system: `the system's ${SYSTEM_NCCL} (the dynamic loader's search path: LD_LIBRARY_PATH, ldconfig)`,
  wheel: 'PyTorch\'s NCCL wheel',
};

function unavailable(attempts: NcclAttempt[]): NcclUnavailableError {
  const lines = attempts.map((a) => `  - ${PLACES[a.source]}: ${a.path}: ${a.error}`);
  return new NcclUnavailableError(
    `no usable NCCL library was found; looked in:\n${lines.join('\n')}\n` +
    `Install NCCL 2.14 or newer (e.g. apt install libnccl2, or pip install nvidia-nccl-cu12), or name the file with ${NCCL_LIBRARY_ENV}=/path/to/libnccl.so.2`,
    attempts);
}
