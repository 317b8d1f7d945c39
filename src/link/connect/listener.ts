// listen() and connect(): links between unrelated processes through a named Unix socket; a
// tcp:// or tls:// URL instead of a name goes to tcp-listener.ts / tcp-connect.ts.
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError, fdLimitError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import type { NativeAcceptor } from '../../native/posix-types.js';
import { Link, kCreate, kOpened } from '../connection/link.js';
import { LINK_OPTION_KEYS, linkLimits, type LinkLimits, type LinkOptions } from '../connection/link-options.js';
import { checkOptionKeys, checkSignal, optionalInteger, invalidArgValue } from '../../arg-errors.js';
import { abortError, checkTimeout, raceWait, type WaitOptions } from '../../abort.js';
import { AcceptWaiters, acceptUntilClosed } from './accept-waiters.js';
import { REFUSED_INTERVAL_MS, RefusalReporter, type RefusedReport } from './refusal-report.js';

const EMFILE = 24;
const ENFILE = 23;
import { Queue } from '../transport/queue.js';
import { socketPath } from '../transport/socket-path.js';
import { bindSocketFile } from '../transport/socket-file.js';
import { refuseBusy } from '../transport/handshake.js';
import { ensurePrivateDirectory } from '../../runtime-directory.js';
import { removeIfSame, type FileIdentity } from '../../safe-files.js';

const myUid = process.getuid?.() ?? -1;
import { isUrl, type LinkUrl } from '../transport/link-url.js';
import { listenTcp, type TcpListener, type TcpListenOptions } from './tcp-listener.js';
import { connectTcp, type TcpConnectOptions } from './tcp-connect.js';

/** Options of listen(); the LinkOptions bound each accepted link. */
export interface ListenOptions extends LinkOptions {
  /** Other uids whose processes may connect (yours always may). The socket file is then 0666;
   * the directory's permissions still apply, so pass `directory` as well. */
  allowUids?: readonly number[];
  /** Directory for the socket instead of the private per-user default (must exist). */
  directory?: string;
  backlog?: number;
  /**
   * A connection must finish its handshake in this time (default 3 s; an honest peer sends its
   * HELLO as it connects), so that silent connections do not hold their place for long.
   */
  handshakeTimeoutMs?: number;
  /**
   * Connections held at once that are still in their handshake or not yet accepted (default
   * 128): more are refused at once, so that peers that connect and never finish cannot use up
   * this process's fds. The peer's connect() is told (ERR_LISTENER_BUSY, and it tries again
   * until its timeout) and 'refused' reports ERR_LIMIT_REACHED (limit 'maxPending').
   */
  maxPending?: number;
  /**
   * Of maxPending, the most one other uid may hold (default 16; this process's own uid is bound
   * by maxPending alone), so that one allowed user that floods the listener with silent
   * connections cannot lock the others out. Refused as for maxPending, limit 'maxPendingPerUid'.
   */
  maxPendingPerUid?: number;
  /** The least time between two 'refused' events, in ms (default 1000): refusals in between are counted into one report. */
  refusedIntervalMs?: number;
}

const LISTEN_OPTION_KEYS: Readonly<Record<keyof ListenOptions, true>> = {
  ...LINK_OPTION_KEYS, allowUids: true, directory: true, backlog: true, handshakeTimeoutMs: true, maxPending: true, maxPendingPerUid: true, refusedIntervalMs: true,
};

/** Options of connect(); the LinkOptions bound the link. */
export interface ConnectOptions extends LinkOptions {
  /** Other uids the listening process may run as (yours always may). */
  allowUids?: readonly number[];
  directory?: string;
  /**
   * How long to wait, in ms, for a listener to appear (it is tried again with a growing pause
   * while the socket file is missing or stale, its backlog full, or it refuses as busy) and for
   * the handshake (default 10 s). Then the promise rejects with ERR_TIMEOUT, or ERR_LISTENER_BUSY
   * when the listener stayed busy. 0: try once, and fail with ERR_NO_LISTENER at once when nobody
   * listens (ERR_LISTENER_BUSY when it refuses as busy); a listener that is there gets the default
   * 10 s for the handshake, as a TCP connect's does.
   */
  timeout?: number;
  /** The older name of `timeout`. */
  timeoutMs?: number;
  /** Gives up when it aborts: the promise rejects with an AbortError (code ABORT_ERR). */
  signal?: AbortSignal;
}

const CONNECT_OPTION_KEYS: Readonly<Record<keyof ConnectOptions, true>> = {
  ...LINK_OPTION_KEYS, allowUids: true, directory: true, timeout: true, timeoutMs: true, signal: true,
};

function closeQuietly(fd: number): void {
  try {
    addon.close(fd);
  } catch {
    // Nothing left to release.
  }
}

function codeOf(e: unknown): string | undefined {
  return (e as { code?: string })?.code;
}

/** The events of a Listener and the arguments their listeners get (no catch-all). */
export interface ListenerEvents {
  /** A link whose handshake succeeded and that no pending accept() took. */
  connection: [link: Link];
  /**
   * Connections from a refused uid, that failed their handshake or went past a bound; they were
   * closed. Coalesced: `error` is the first of them, `report` counts them all by code and by uid
   * (`uid N`; at most one event per refusedIntervalMs, the first after a quiet interval at once).
   */
  refused: [error: IpcError, report: RefusedReport];
  /** The listening socket failed; emitted only when someone listens for it. */
  error: [error: Error];
  /** The listener closed. */
  close: [];
  /** EventEmitter's own: a listener is about to be added. */
  newListener: [event: string | symbol, listener: (...args: any[]) => void];
  /** EventEmitter's own: a listener was removed. */
  removeListener: [event: string | symbol, listener: (...args: any[]) => void];
}

export interface Listener {
  /** Adds a listener for `event` (see ListenerEvents). */
  on<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Adds a listener called once for `event`. */
  once<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Removes a listener. */
  off<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Same as on(). */
  addListener<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Same as off(). */
  removeListener<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Adds a listener before the others. */
  prependListener<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
  /** Adds a once-listener before the others. */
  prependOnceListener<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this;
}

/**
 * A named socket accepting links. Each connection is handed over once its handshake succeeded:
 * to a pending accept() first, else to 'connection' listeners, else it waits for accept() /
 * `for await`. Connections from a refused uid, or that fail the handshake, are closed and
 * reported as 'refused' (a connection that hangs up before its handshake is dropped silently).
 */
export class Listener extends EventEmitter implements Disposable, AsyncIterable<Link> {
  readonly name: string;
  readonly path: string;
  #acceptor: NativeAcceptor | undefined;
  /** The socket file this listener made: close() removes that one only. */
  readonly #file: FileIdentity;
  readonly #options: ListenOptions;
  readonly #limits: LinkLimits;
  readonly #maxPending: number;
  readonly #maxPendingPerUid: number;
  readonly #handshakeTimeoutMs: number;
  readonly #handshaking = new Set<Link>();
  readonly #ready = new Queue<Link>();
  /** Links in their handshake or waiting for accept(), by the peer's uid: what maxPending and maxPendingPerUid bound. */
  readonly #held = new Map<Link, { uid: number; forget: () => unknown }>();
  readonly #heldByUid = new Map<number, number>();
  readonly #waiters = new AcceptWaiters();
  readonly #reporter: RefusalReporter;
  #retryTimer: NodeJS.Timeout | undefined;

  /** @internal Use listen(). */
  constructor(token: typeof kCreate, name: string, path: string, fd: number, file: FileIdentity, options: ListenOptions) {
    super();
    if (token !== kCreate) throw invalidArgValue('use listen() to create a Listener');
    this.name = name;
    this.path = path;
    this.#options = options;
    this.#limits = linkLimits(options, 'options');
    ({ maxPending: this.#maxPending, maxPendingPerUid: this.#maxPendingPerUid, handshakeTimeoutMs: this.#handshakeTimeoutMs } = pendingBounds(options));
    this.#file = file;
    this.#reporter = new RefusalReporter(optionalInteger(options.refusedIntervalMs, 'options.refusedIntervalMs', REFUSED_INTERVAL_MS, 0), (error, report) => {
      if (this.listenerCount('refused') > 0) this.emit('refused', error, report);
    });
    this.#acceptor = new addon.Acceptor(fd, this.#onAccept);
  }

  get closed(): boolean {
    return this.#acceptor === undefined;
  }

  #onAccept = (fdOrError: number): void => {
    if (fdOrError < 0) {
      // Out of fds or similar: report and retry shortly instead of spinning.
      const errno = -fdOrError;
      const err = errno === EMFILE || errno === ENFILE
        ? new IpcError('ERR_FD_LIMIT', `listener '${this.name}' cannot accept a connection: no file descriptor left (${errno === EMFILE ? 'EMFILE; see `ulimit -n`' : 'ENFILE'}); retrying in 100 ms`)
        : new IpcError('ERR_UNSUPPORTED', `accept on ${this.path} failed (errno ${errno}); retrying in 100 ms`);
      if (this.listenerCount('error') > 0) this.emit('error', err);
      this.#retryTimer = setTimeout(() => this.#acceptor?.setInterest(true), 100).unref();
      return;
    }
    let uid: number;
    try {
      uid = addon.peerCred(fdOrError).uid;
    } catch {
      closeQuietly(fdOrError); // gone already
      return;
    }
    const busy = this.#held.size >= this.#maxPending
      ? `${this.#maxPending} ${this.#maxPending === 1 ? 'connection is' : 'connections are'} already waiting for their handshake or for accept()`
      : uid !== myUid && (this.#heldByUid.get(uid) ?? 0) >= this.#maxPendingPerUid
        ? `${this.#maxPendingPerUid} ${this.#maxPendingPerUid === 1 ? 'connection' : 'connections'} of uid ${uid} ${this.#maxPendingPerUid === 1 ? 'is' : 'are'} already waiting for their handshake or for accept()`
        : undefined;
    if (busy) {
      const limit = this.#held.size >= this.#maxPending ? 'maxPending' : 'maxPendingPerUid';
      refuseBusy(fdOrError, `listener '${this.name}' (pid ${process.pid}) has no room: ${busy} (${limit}); try again later`);
      this.#reporter.note('ERR_LIMIT_REACHED', `uid ${uid}`, () => new IpcError('ERR_LIMIT_REACHED', `listener '${this.name}' refused a connection from uid ${uid}: ${busy} (${limit})`, { limit }));
      return;
    }
    let link: Link;
    try {
      link = new Link(kCreate, {
        fd: fdOrError,
        peerFrom: 'socket',
        verifyPeer: true,
        allowUids: this.#options.allowUids ?? [],
        helloFirst: true,
        handshakeTimeoutMs: this.#handshakeTimeoutMs,
        peerName: `process connected to '${this.name}'`,
        limits: this.#limits,
      });
    } catch (e) {
      this.#refused(e, uid);
      return;
    }
    this.#hold(link, uid);
    this.#handshaking.add(link);
    link[kOpened]().then(
      () => {
        this.#handshaking.delete(link);
        if (this.closed) link.close();
        else this.#hand(link);
      },
      (e: unknown) => {
        this.#handshaking.delete(link);
        this.#release(link);
        // A peer that hangs up before its handshake (such as a liveness probe) is no news.
        if (!(e instanceof IpcError && e.code === 'ERR_PEER_GONE') && !this.closed) this.#refused(e, uid);
      },
    );
  };

  #hold(link: Link, uid: number): void {
    // A link waiting for accept() whose peer hangs up no longer holds a place.
    this.#held.set(link, { uid, forget: link.onClose(() => this.#release(link)) });
    this.#heldByUid.set(uid, (this.#heldByUid.get(uid) ?? 0) + 1);
  }

  /** The link left the listener's care (handed out, closed, failed). Idempotent. */
  #release(link: Link): void {
    const held = this.#held.get(link);
    if (held === undefined) return;
    this.#held.delete(link);
    held.forget();
    const uid = held.uid;
    const n = (this.#heldByUid.get(uid) ?? 1) - 1;
    if (n > 0) this.#heldByUid.set(uid, n);
    else this.#heldByUid.delete(uid);
  }

  #refused(e: unknown, uid: number): void {
    const err = e instanceof IpcError ? e : new IpcError('ERR_PEER_REFUSED', String((e as Error)?.message ?? e), { cause: e });
    this.#reporter.note(err.code, `uid ${uid}`, () => err);
  }

  #hand(link: Link): void {
    if (this.#waiters.waiting) {
      this.#release(link);
      this.#waiters.hand(link);
    } else if (this.#ready.length === 0 && this.listenerCount('connection') > 0) {
      this.#release(link);
      this.emit('connection', link);
    } else {
      this.#ready.push(link);
    }
  }

  /** The next link waiting for accept() that is still open. */
  #takeReady(): Link | undefined {
    for (let link = this.#ready.shift(); link; link = this.#ready.shift()) {
      this.#release(link);
      if (!link.closed) return link;
    }
    return undefined;
  }

  /** The next connection; `options`: give up on a signal (AbortError) or after a timeout (ERR_TIMEOUT). */
  accept(options?: WaitOptions): Promise<Link> {
    const link = this.#takeReady();
    if (link) return Promise.resolve(link);
    if (this.closed) return Promise.reject(new IpcError('ERR_LINK_CLOSED', `the listener '${this.name}' is closed`));
    return this.#waiters.wait(options);
  }

  /** Yields connections until the listener is closed. */
  [Symbol.asyncIterator](): AsyncIterator<Link> {
    return acceptUntilClosed(() => this.accept());
  }

  /** Keep the process alive while this listener is open (the default). */
  ref(): this {
    this.#acceptor?.ref();
    return this;
  }
  /** Let the process exit even though this listener is open. */
  unref(): this {
    this.#acceptor?.unref();
    return this;
  }

  /** Stops listening and removes the socket file. Links already handed out stay open; links
   * still in their handshake or never accepted are closed. */
  close(): void {
    const acceptor = this.#acceptor;
    if (!acceptor) return;
    this.#acceptor = undefined;
    clearTimeout(this.#retryTimer);
    this.#reporter.flush(); // what was gathered is still told
    acceptor.close();
    // Only our own socket file: a newer listener (or anyone else) may have replaced the name.
    removeIfSame(this.path, this.#file);
    for (const l of this.#handshaking) l.close();
    this.#handshaking.clear();
    for (const l of this.#ready.drain()) l.close();
    this.#held.clear();
    this.#heldByUid.clear();
    const err = new IpcError('ERR_LINK_CLOSED', `the listener '${this.name}' is closed`);
    this.#waiters.rejectAll(err);
    this.emit('close');
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * Listens for links from other machines at `url` (`tcp://HOST:PORT` or `tls://HOST:PORT`, HOST an
 * IP address: the listener binds exactly it; port 0 picks a free one, which `listener.url` then
 * names). Resolves once it listens (Node binds asynchronously, so unlike listen(name) this is a
 * Promise). Every connection must prove the shared token (`options.token` or CUDA_IPC_TOKEN);
 * without one this rejects with ERR_AUTH_FAILED. A URL held in a plain `string` type-checks as
 * a name: give it the type LinkUrl (`url as LinkUrl`) to get this overload. Any `SCHEME://...` is
 * taken for a URL, never a name: one that is not a link URL rejects with a TypeError
 * ERR_INVALID_URL naming the forms it takes.
 */
export function listen(url: LinkUrl, options?: TcpListenOptions): Promise<TcpListener>;
/**
 * Listens for links on `name` (a socket file in a private per-user directory, or in
 * `options.directory`). A stale socket file left by a dead listener is replaced; a live one
 * makes this throw ERR_ADDRESS_IN_USE.
 * @throws IpcError ERR_ADDRESS_IN_USE when another process listens on `name`;
 * ERR_SOCKET_DIR_UNSAFE when the private directory is not this user's alone; ERR_FD_LIMIT when
 * no fd is left; the system error (EACCES, ENOENT, ENOTDIR, ...) for a `directory` it cannot bind in.
 * @throws TypeError ERR_INVALID_ARG_VALUE for an option listen does not know (it does not wait:
 * `accept({ signal, timeout })` does), a bad name; TypeError / RangeError for a bad option value.
 */
export function listen(name: string, options?: ListenOptions): Listener;
export function listen(name: string, options: ListenOptions = {}): Listener | Promise<TcpListener> {
  // Any SCHEME:// is a URL, never a name: listenTcp says what is wrong with one that is not a link's.
  if (isUrl(name)) return listenTcp(name as LinkUrl, options as TcpListenOptions);
  const waitHint = 'listen() does not wait; pass it to listener.accept({ signal, timeout }) (handshakeTimeoutMs bounds each connection\'s handshake)';
  checkOptionKeys(options, LISTEN_OPTION_KEYS, 'listen', { timeout: waitHint, signal: waitHint });
  linkLimits(options, 'options');
  const path = socketPath(name, options.directory);
  pendingBounds(options);
  if (options.directory === undefined) ensurePrivateDirectory(path.slice(0, path.lastIndexOf('/')));
  let fd: number;
  try {
    fd = addon.socket();
  } catch (e) {
    throw fdLimitError(e, 'listen');
  }
  try {
    let file: ReturnType<typeof bindSocketFile>;
    try {
      file = bindSocketFile(fd, path, name, options.allowUids?.length ? 0o666 : 0o600);
    } catch (e) {
      throw notADirectory(e, 'listen', path);
    }
    try {
      addon.listen(fd, options.backlog ?? 128);
      return new Listener(kCreate, name, path, fd, file, options);
    } catch (e) {
      removeIfSame(path, file);
      throw e;
    }
  } catch (e) {
    closeQuietly(fd);
    throw e;
  }
}

/** ListenOptions' bounds on connections not yet handed out, checked, defaults filled in. */
function pendingBounds(options: ListenOptions): { maxPending: number; maxPendingPerUid: number; handshakeTimeoutMs: number } {
  return {
    maxPending: optionalInteger(options.maxPending, 'options.maxPending', 128, 1),
    maxPendingPerUid: optionalInteger(options.maxPendingPerUid, 'options.maxPendingPerUid', 16, 1),
    handshakeTimeoutMs: optionalInteger(options.handshakeTimeoutMs, 'options.handshakeTimeoutMs', 3_000, 1),
  };
}

/** connect()'s timeout when none is given, and the handshake's with `timeout: 0`. */
const DEFAULT_CONNECT_MS = 10_000;
/** The first and the longest pause between tries while no listener is there. */
const RETRY_FIRST_MS = 5;
const RETRY_MOST_MS = 250;

/**
 * Connects to the listener named `name`, or at the URL `name` (`tcp://HOST:PORT`,
 * `tls://HOST:PORT`: a link to another machine, options TcpConnectOptions); resolves once the
 * handshake succeeded. Waits for the listener to appear, up to `options.timeout` (see
 * ConnectOptions). `In`/`Out` type the link: what this process receives, and what it sends.
 * @throws IpcError (the promise rejects) ERR_TIMEOUT when no listener appeared, or the handshake
 * did not finish, within `options.timeout` (10 s); ERR_NO_LISTENER with `timeout: 0` and nobody
 * listening, and for a TCP address where nobody listened until the timeout (connection refused);
 * ERR_LISTENER_BUSY when the listener kept refusing for want of room (a TCP listener: kept closing
 * the connection before the token exchange); ERR_PEER_REFUSED
 * when the socket belongs to another user or the listener runs as a uid not in `allowUids` (or
 * refused ours); ERR_AUTH_FAILED on a TCP link whose token is missing or not the listener's;
 * ERR_FD_LIMIT when no fd is left; an AbortError on `options.signal`.
 * @throws TypeError ERR_INVALID_ARG_VALUE for an option connect does not know, a bad name;
 * ERR_INVALID_URL (the promise rejects) for a `SCHEME://...` that is not a link URL
 * (`tcp://HOST:PORT`, `tls://HOST:PORT`; any scheme is taken for a URL, never a name);
 * TypeError / RangeError for a bad option value.
 */
export function connect<In = unknown, Out = unknown>(name: string, options?: ConnectOptions | TcpConnectOptions): Promise<Link<In, Out>>;
export async function connect(name: string, options: ConnectOptions | TcpConnectOptions = {}): Promise<Link> {
  if (isUrl(name)) return connectTcp(name as LinkUrl, options as TcpConnectOptions);
  return connectUnix(name, options as ConnectOptions);
}

async function connectUnix(name: string, options: ConnectOptions): Promise<Link> {
  checkOptionKeys(options, CONNECT_OPTION_KEYS, 'connect', { handshakeTimeoutMs: 'connect() takes timeout (ms) for the whole wait, handshake included' });
  const limits = linkLimits(options, 'options');
  const signal = checkSignal(options.signal);
  const timeoutMs = checkTimeout(options.timeout ?? options.timeoutMs, options.timeout !== undefined ? 'options.timeout' : 'options.timeoutMs') ?? DEFAULT_CONNECT_MS;
  const path = socketPath(name, options.directory);
  const deadline = Date.now() + timeoutMs;
  if (signal?.aborted) throw abortError(signal.reason, 'connect');
  const pause = { ms: RETRY_FIRST_MS };
  let busy: IpcError | undefined;
  for (;;) {
    const fd = await reachListener(name, path, deadline, timeoutMs, signal, pause);
    const link = new Link(kCreate, {
      fd,
      peerFrom: 'socket',
      verifyPeer: true,
      allowUids: options.allowUids ?? [],
      helloFirst: true,
      // Try once (0) reaches the listener once; its handshake still gets the default time.
      handshakeTimeoutMs: timeoutMs === 0 ? DEFAULT_CONNECT_MS : Math.max(1, deadline - Date.now()),
      peerName: `listener '${name}'`,
      limits,
    });
    try {
      await raceWait(link[kOpened](), signal ? { signal } : undefined, 'connect', () => link.close());
      return link;
    } catch (e) {
      // Too many connections waiting there (maxPending, or maxPendingPerUid for this uid): as for
      // a full backlog, try again until the deadline. A last try that the deadline cut short is
      // still that listener being busy.
      const stillBusy = busy && e instanceof IpcError && e.code === 'ERR_TIMEOUT';
      if (!(e instanceof IpcError && e.code === 'ERR_LISTENER_BUSY') && !stillBusy) throw e;
      if (!stillBusy) busy = e;
      const left = deadline - Date.now();
      if (timeoutMs === 0) throw e;
      if (left <= 0 || stillBusy) throw new IpcError('ERR_LISTENER_BUSY', `connect: ${busy!.message}; it stayed so for ${timeoutMs} ms (the timeout option)`, { cause: busy });
      await pauseFor(Math.min(pause.ms, left), signal);
      pause.ms = Math.min(pause.ms * 2, RETRY_MOST_MS);
    }
  }
}

async function pauseFor(ms: number, signal: AbortSignal | undefined): Promise<void> {
  try {
    await sleep(ms, undefined, signal ? { signal } : undefined);
  } catch {
    throw abortError(signal!.reason, 'connect');
  }
}

/** ENOTDIR (the directory of `path`, options.directory, is a file, or one above it is): the same
 * code, with a message that says which path and what to pass; any other error as it was. */
function notADirectory(e: unknown, what: string, path: string): unknown {
  if (codeOf(e) !== 'ENOTDIR') return e;
  const dir = path.slice(0, path.lastIndexOf('/'));
  return Object.assign(new Error(`${what}: ${JSON.stringify(dir)} is not a directory (options.directory must name the directory the socket file is in)`, { cause: e }),
    { code: 'ENOTDIR' });
}

/** A socket connected to `path`, tried again while nobody listens there yet or its backlog is full, until the deadline. */
async function reachListener(name: string, path: string, deadline: number, timeoutMs: number, signal: AbortSignal | undefined, pause: { ms: number }): Promise<number> {
  for (;;) {
    let fd: number;
    try {
      fd = addon.socket();
    } catch (e) {
      throw fdLimitError(e, 'connect');
    }
    let why: IpcError;
    try {
      addon.connect(fd, path);
      return fd;
    } catch (e) {
      closeQuietly(fd);
      const code = codeOf(e);
      if (code === 'EACCES' || code === 'EPERM') {
        throw new IpcError('ERR_PEER_REFUSED', `permission denied connecting to '${name}' (${path}): it belongs to another user`, { cause: e });
      }
      if (code === 'ENOENT') why = new IpcError('ERR_NO_LISTENER', `no listener named '${name}': ${path} does not exist; start the listening process first`, { cause: e });
      else if (code === 'ECONNREFUSED') why = new IpcError('ERR_NO_LISTENER', `no listener named '${name}': ${path} is a stale socket left by a process that is gone`, { cause: e });
      else if (code === 'EAGAIN') why = new IpcError('ERR_TIMEOUT', `the listener '${name}' is too busy to accept a connection (its backlog is full)`, { cause: e });
      else throw notADirectory(e, 'connect', path);
    }
    // Nobody there yet (or too busy): wait for the listener, until the deadline.
    const left = deadline - Date.now();
    if (timeoutMs === 0 && why.code === 'ERR_NO_LISTENER') throw why;
    if (left <= 0) {
      throw new IpcError('ERR_TIMEOUT', `connect: ${why.message.replace(/; start the listening process first$/, '')}, and none appeared within ${timeoutMs} ms (the timeout option)`, { cause: why });
    }
    await pauseFor(Math.min(pause.ms, left), signal);
    pause.ms = Math.min(pause.ms * 2, RETRY_MOST_MS);
  }
}
