// spawn(): start a Node child running an ES module, connected to this process by a link over a
// socketpair; parentLink(): the child's end of it.
import { spawn as spawnProcess, type ChildProcess, type StdioOptions } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';
import { IpcError, fdLimitError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { Device, WORKING_DEVICE_ENV } from '../../cuda/device.js';
import { checkDeviceUuid } from '../../ipc/device-uuid.js';
import { ARG } from '../../ipc/checks.js';
import { Link, kCreate, kOpened } from '../connection/link.js';
import { LINK_OPTION_KEYS, linkLimits, type LinkOptions } from '../connection/link-options.js';
import { checkObject, checkOptionKeys, checkSignal, invalidArgType, invalidArgValue, received } from '../../arg-errors.js';
import { abortError, checkTimeout, raceWait } from '../../abort.js';

/** The environment variable telling a spawned child which fd is its link. */
export const LINK_FD_ENV = 'CUDA_IPC_LINK_FD';

/** Options of spawn(); the LinkOptions bound the link. */
export interface SpawnOptions extends LinkOptions {
  /** Arguments for node itself; default: this process's execArgv without inspector, test-runner,
   * watch and eval flags. */
  execArgv?: readonly string[];
  /** Environment of the child (default process.env); the link variable is added. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** stdin/stdout/stderr of the child, as for child_process.spawn (default 'inherit'). */
  stdio?: 'inherit' | 'pipe' | 'ignore' | readonly ('inherit' | 'pipe' | 'ignore' | number | null | undefined)[];
  /** Run the child as this user / group (needs privileges). A child with another uid is refused
   * unless that uid is in allowUids. */
  uid?: number;
  gid?: number;
  /** uids other than ours that the child may run as. */
  allowUids?: readonly number[];
  /** How long the child has to call parentLink(), in ms (default 30000); then the child is
   * killed and the promise rejects with ERR_TIMEOUT. */
  timeout?: number;
  /** The older name of `timeout`. */
  handshakeTimeoutMs?: number;
  /** Gives up when it aborts: the child is killed and the promise rejects with an AbortError. */
  signal?: AbortSignal;
  /**
   * The GPU the child works on (a Device or its UUID): memory it imports is mapped for that GPU,
   * wherever it lives, and workingDevice() returns it there. Sent as the UUID (CUDA_IPC_DEVICE),
   * so it names the same GPU whatever CUDA_VISIBLE_DEVICES the child has.
   */
  device?: Device | string;
  /**
   * Small frames without fds through a shared-memory ring each way once both sides agree. Off by
   * default (on where CUDA_IPC_LINK_RING=1): on the machines measured so far the socket was as
   * fast or faster (docs/PROTOCOL.md section 3.3). true offers rings and tells the child to offer
   * its own (CUDA_IPC_LINK_RING=1 in its environment); false keeps this link on its socket alone.
   */
  frameRing?: boolean;
}

/** What spawn() resolves with: the child process and the link to it (typed as `Link<In, Out>`). */
export interface SpawnedChild<In = unknown, Out = unknown> {
  child: ChildProcess;
  link: Link<In, Out>;
}

/** The keys of SpawnOptions: any other is refused (a misspelt option would do nothing). */
export const SPAWN_OPTION_KEYS: Readonly<Record<keyof SpawnOptions, true>> = {
  ...LINK_OPTION_KEYS, execArgv: true, env: true, cwd: true, stdio: true, uid: true, gid: true, allowUids: true,
  timeout: true, handshakeTimeoutMs: true, signal: true, device: true, frameRing: true,
};

/** The default of spawn()'s `timeout`: how long a child has to call parentLink(). */
const SPAWN_TIMEOUT_MS = 30_000;

const DROP_FLAGS = /^(--inspect|--debug|--test|--experimental-test|--watch|--eval|-e$|--print|-p$|-pe$|--input-type|--check|-c$|--interactive|-i$)/;
const FLAGS_WITH_VALUE = new Set([
  '--inspect-port', '--debug-port', '--test-reporter', '--test-reporter-destination', '--test-name-pattern',
  '--test-skip-pattern', '--test-concurrency', '--test-timeout', '--test-shard', '--watch-path', '--eval', '-e',
  '--print', '-p', '-pe', '--input-type',
]);

/** This process's node flags that make sense for a child. */
function inheritableExecArgv(): string[] {
  const out: string[] = [];
  const argv = process.execArgv;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (DROP_FLAGS.test(a)) {
      if (FLAGS_WITH_VALUE.has(a)) i++;
      continue;
    }
    out.push(a);
  }
  return out;
}

function modulePath(module: string | URL): string {
  if (module instanceof URL) return fileURLToPath(module);
  if (module.startsWith('file:')) return fileURLToPath(module);
  return resolvePath(module);
}

/**
 * The arguments spawn() and spawnPython() share, checked as TypeScript would check them, for
 * callers in plain JavaScript: typed errors with codes at once, before anything starts.
 */
export function checkChildArguments<O extends object>(fn: string, module: unknown, args: unknown, options: unknown): { module: string | URL; args: readonly string[]; options: O } {
  if (typeof module !== 'string' && !(module instanceof URL)) {
    throw invalidArgType(`The "module" argument must be of type string or an instance of URL. ${received(module)}`);
  }
  if (module === '') throw invalidArgValue(`${fn}: the "module" argument is empty; give the ${fn === 'spawn' ? 'path or URL of the ES module' : 'module name or .py file'} the child runs`);
  if (args !== undefined && !Array.isArray(args)) {
    const hint = typeof args === 'object' && args !== null ? `; options go third: ${fn}(module, [], options)` : '';
    throw invalidArgType(`The "args" argument must be an array of strings. ${received(args)}${hint}`);
  }
  const list = (args ?? []) as readonly unknown[];
  list.forEach((a, i) => {
    if (typeof a !== 'string') throw invalidArgType(`The "args[${i}]" argument must be of type string. ${received(a)}`);
  });
  const opts = checkObject<O>(options, 'options') ?? ({} as O);
  return { module, args: list as readonly string[], options: opts };
}

/** spawn()'s arguments: the shared checks, its option keys, and the module's file. */
function checkSpawnArguments(moduleArg: unknown, argsArg: unknown, optionsArg: unknown): { path: string; args: readonly string[]; options: SpawnOptions } {
  const { module, args, options: opts } = checkChildArguments<SpawnOptions>('spawn', moduleArg, argsArg, optionsArg);
  checkOptionKeys(opts, SPAWN_OPTION_KEYS, 'spawn');
  if (opts.execArgv !== undefined) checkStrings(opts.execArgv, 'options.execArgv');
  let path: string;
  try {
    path = modulePath(module);
  } catch (e) {
    throw invalidArgValue(`spawn: ${String(module)} is not a file URL or a path: ${(e as Error).message}`, { cause: e });
  }
  if (!existsSync(path)) {
    const relative = module instanceof URL || module.startsWith('file:') ? '' : ` (a path is relative to the working directory, ${process.cwd()}; new URL('./worker.js', import.meta.url) names a file beside the calling module)`;
    throw invalidArgValue(`spawn: ${path} does not exist${relative}`);
  }
  return { path, args, options: opts };
}

/** Checks that `value` is an array of strings: ERR_INVALID_ARG_TYPE naming `name` otherwise. */
export function checkStrings(value: unknown, name: string): void {
  if (!Array.isArray(value)) throw invalidArgType(`The "${name}" property must be an array of strings. ${received(value)}`);
  value.forEach((v, i) => {
    if (typeof v !== 'string') throw invalidArgType(`The "${name}[${i}]" property must be of type string. ${received(v)}`);
  });
}

/**
 * Starts `node <module> ...args` with a link to this process, and resolves once the child has
 * called parentLink(). `module` is a URL (`new URL('./worker.js', import.meta.url)`: relative to
 * the calling module) or a path (relative to the working directory, `process.cwd()`), the rule
 * spawnPython() follows too. `In`/`Out` type the link: what this process receives from the child,
 * and what it sends.
 *
 * @throws IpcError (the promise rejects; the child is killed): ERR_PEER_GONE when the child exits
 * or closes its link before calling parentLink() (or cannot start), ERR_PEER_REFUSED when it runs
 * as a uid not allowed (`allowUids`), ERR_TIMEOUT when it has not called parentLink() within
 * `options.timeout` (30 s), an AbortError on `options.signal`.
 * @throws TypeError (the promise rejects at once; nothing starts) ERR_INVALID_ARG_VALUE for a module
 * file that does not exist or an option spawn does not know (a misspelt one would otherwise do
 * nothing); ERR_INVALID_ARG_TYPE for a `module` that is no string or URL, `args` that are not an
 * array of strings (options go third), `options` that are not an object; TypeError / RangeError
 * for a bad option value.
 */
export function spawn<In = unknown, Out = unknown>(module: string | URL, args?: readonly string[], options?: SpawnOptions): Promise<SpawnedChild<In, Out>>;
export async function spawn(module: string | URL, args?: readonly string[], options?: SpawnOptions): Promise<SpawnedChild> {
  const checked = checkSpawnArguments(module, args, options);
  const o = checked.options;
  return startLinkedChild(process.execPath, [...(o.execArgv ?? inheritableExecArgv()), checked.path, ...checked.args], o, checked.path);
}

/**
 * @internal Starts `command argv...` with the child's end of a socketpair as an inherited fd
 * (named by LINK_FD_ENV) and resolves once the child's HELLO arrived: the part of spawn() that
 * spawnPython() shares. `what` names the child in errors.
 */
export async function startLinkedChild(command: string, argv: readonly string[], options: SpawnOptions, what: string): Promise<SpawnedChild> {
  const path = what;
  if (options.allowUids !== undefined && (!Array.isArray(options.allowUids) || !options.allowUids.every((u) => Number.isInteger(u) && u >= 0))) {
    throw invalidArgType(`The "options.allowUids" property must be an array of uids (integers >= 0). ${received(options.allowUids)}`);
  }
  if (options.frameRing !== undefined && typeof options.frameRing !== 'boolean') {
    throw invalidArgType(`The "options.frameRing" property must be of type boolean. ${received(options.frameRing)}`);
  }
  if (options.env !== undefined) checkObject(options.env, 'options.env');
  const deviceEnv = options.device === undefined ? {} : { [WORKING_DEVICE_ENV]: workingDeviceUuid(options.device) };
  const limits = linkLimits(options, 'options');
  const signal = checkSignal(options.signal);
  // undefined: no bound (Infinity).
  const timeout = options.timeout !== undefined ? checkTimeout(options.timeout, 'options.timeout')
    : options.handshakeTimeoutMs !== undefined ? checkTimeout(options.handshakeTimeoutMs, 'options.handshakeTimeoutMs') : SPAWN_TIMEOUT_MS;
  if (signal?.aborted) throw abortError(signal.reason, 'spawn');
  let parentFd: number;
  let childFd: number;
  try {
    [parentFd, childFd] = addon.socketpair();
  } catch (e) {
    throw fdLimitError(e, 'spawn (a link is a socketpair)');
  }
  let link: Link;
  try {
    // Created before the child exists, so that SO_PASSCRED is set before its HELLO is sent.
    link = new Link(kCreate, {
      fd: parentFd,
      peerFrom: 'hello',
      verifyPeer: true,
      allowUids: options.allowUids ?? [],
      helloFirst: false,
      ...(timeout !== undefined ? { handshakeTimeoutMs: timeout } : {}),
      peerName: 'child process',
      frameRing: options.frameRing,
      limits,
    });
  } catch (e) {
    addon.close(childFd);
    throw e;
  }
  const std = options.stdio ?? 'inherit';
  const stdio: unknown[] = typeof std === 'string' ? [std, std, std] : [...std];
  while (stdio.length < 3) stdio.push('inherit');
  const childIndex = stdio.length;
  stdio.push(childFd);
  let child: ChildProcess;
  try {
    child = spawnProcess(command, argv, {
      stdio: stdio as StdioOptions,
      env: {
        ...(options.env ?? process.env),
        ...deviceEnv,
        ...(options.frameRing !== undefined ? { CUDA_IPC_LINK_RING: options.frameRing ? '1' : '0' } : {}),
        [LINK_FD_ENV]: String(childIndex),
      },
      ...(options.cwd !== undefined ? { cwd: options.cwd } : {}),
      ...(options.uid !== undefined ? { uid: options.uid } : {}),
      ...(options.gid !== undefined ? { gid: options.gid } : {}),
    });
  } catch (e) {
    link.close();
    throw e;
  } finally {
    // The child has its copy now; ours must go, or the child's death would never read as EOF.
    addon.close(childFd);
  }
  const spawnError = new Promise<never>((_, reject) => {
    child.once('error', (e) => reject(new IpcError('ERR_PEER_GONE', `could not start the child process for ${path}: ${e.message}`, { cause: e })));
  });
  try {
    await raceWait(Promise.race([link[kOpened](), spawnError]), signal ? { signal } : undefined, 'spawn');
  } catch (e) {
    link.close();
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    if (e instanceof IpcError && e.code === 'ERR_PEER_GONE' && !e.message.startsWith('could not start')) {
      throw new IpcError('ERR_PEER_GONE', `the child process (pid ${child.pid}) running ${path} exited or closed its link before calling parentLink() (parent_link() in Python)`, { cause: e });
    }
    if (e instanceof IpcError && e.code === 'ERR_TIMEOUT') {
      throw new IpcError('ERR_TIMEOUT', `the child process (pid ${child.pid}) running ${path} did not call parentLink() (parent_link() in Python) within ${timeout} ms (the timeout option); it was killed`, { cause: e });
    }
    throw e;
  }
  spawnError.catch(() => {});
  return { child, link };
}

/** The UUID spawn's `device` option names (checked here: the child may see GPUs this process does not). */
function workingDeviceUuid(device: Device | string): string {
  if (device instanceof Device) return device.uuid;
  const uuid = typeof device === 'string' ? device.toLowerCase().replace(/^gpu-/, 'GPU-') : device;
  return checkDeviceUuid(uuid, { code: ARG, path: 'spawn options.device' });
}

let parent: Link | undefined;

/**
 * The link to the process that started this one with spawn(). The same Link every call (its
 * `options` are those of the first call). The parent is trusted as such (it chose how to start
 * us), so its uid is not checked. `In`/`Out` type the link: what this process receives from its
 * parent, and what it sends. It does not wait: the link opens in the background, and the first
 * `receive()` (which takes `{ signal, timeout }`) waits for the parent's messages.
 *
 * @throws IpcError ERR_NOT_SPAWNED when this process was not started by spawn() / spawnPython's
 * Node counterpart (no link fd in its environment, or the fd is not a link socket).
 * @throws TypeError ERR_INVALID_ARG_VALUE for an option that is not a LinkOptions key;
 * TypeError / RangeError for a bad option value.
 */
export function parentLink<In = unknown, Out = unknown>(options?: LinkOptions): Link<In, Out>;
export function parentLink(options?: LinkOptions): Link {
  const waitHint = 'parentLink() does not wait; pass it to link.receive({ signal, timeout })';
  checkOptionKeys(options, LINK_OPTION_KEYS, 'parentLink', { timeout: waitHint, signal: waitHint });
  if (parent) return parent;
  const limits = linkLimits(options, 'options');
  const value = process.env[LINK_FD_ENV];
  if (value === undefined) {
    throw new IpcError('ERR_NOT_SPAWNED', `parentLink(): this process was not started by cuda-ipc's spawn() (${LINK_FD_ENV} is not set); start it with spawn(moduleUrl)`);
  }
  const fd = Number(value);
  let type = -1;
  if (Number.isInteger(fd) && fd >= 0) {
    try {
      type = addon.socketType(fd);
    } catch {
      // Not a socket: reported below.
    }
  }
  if (type !== addon.posixConstants.SOCK_SEQPACKET) {
    throw new IpcError('ERR_NOT_SPAWNED', `parentLink(): ${LINK_FD_ENV}=${value} does not name a link socket in this process`);
  }
  // Keep it away from our own children and from anyone reading the environment later.
  delete process.env[LINK_FD_ENV];
  addon.setCloexec(fd, true);
  addon.setNonblocking(fd, true);
  parent = new Link(kCreate, {
    fd,
    peerFrom: 'socket',
    verifyPeer: false,
    allowUids: [],
    helloFirst: true,
    peerName: 'parent process',
    limits,
  });
  return parent;
}
