// listen('tcp://HOST:PORT') and listen('tls://HOST:PORT'): links from other machines
// (PROTOCOL.md 2.3). The listener binds exactly the address of its URL (port 0: any free one;
// `url` says which). Each connection runs TLS (tls://), the token exchange and the HELLOs within
// the handshake timeout; the connections still doing so are bounded (maxPending in all,
// maxPendingPerAddress for those of one address still authenticating), and one that has not sent
// its challenge within challengeTimeoutMs is dropped, so that one address flooding the listener
// with silent connections cannot lock out the others. One that fails is closed and counted;
// refusals are reported coalesced ('refused', at most one event per refusedIntervalMs; see
// refusal-report.ts). A connection that sends nothing at all before it closes (a port probe) is
// dropped silently.
import { EventEmitter } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { IpcError } from '../../errors.js';
import type { WaitOptions } from '../../abort.js';
import { AcceptWaiters, acceptUntilClosed } from './accept-waiters.js';
import { checkObject, optionalInteger } from '../../arg-errors.js';
import { Link, kCreate, kOpened } from '../connection/link.js';
import { linkLimits, type LinkLimits } from '../connection/link-options.js';
import { formatLinkUrl, parseLinkUrl, type LinkUrl } from '../transport/link-url.js';
import { Queue } from '../transport/queue.js';
import { AuthRole, authenticate, resolveToken } from '../transport/tcp-auth.js';
import { remoteOf, tlsContextOptions, tlsOptionsFor, tuneSocket, type TcpLinkOptions } from './tcp-connect.js';
import { closeGracefully } from '../transport/tcp-transport.js';
import { REFUSED_INTERVAL_MS, RefusalReporter, type RefusedReport } from './refusal-report.js';

/** Options of listen(url) for a tcp:// or tls:// URL; the LinkOptions bound each accepted link. */
export interface TcpListenOptions extends TcpLinkOptions {
  /** The kernel's queue of connections not yet accepted (default 128). */
  backlog?: number;
  /** A connection must finish TLS, the token exchange and its handshake in this time (default 10 s). */
  handshakeTimeoutMs?: number;
  /**
   * A connection must finish TLS and send its challenge in this time (default 2 s; at most
   * handshakeTimeoutMs): an honest peer sends it as it connects, so a silent connection holds its
   * place this long, not the whole handshake timeout. Refused as ERR_TIMEOUT.
   */
  challengeTimeoutMs?: number;
  /**
   * Connections held at once that are still in TLS, the token exchange or the handshake, or not
   * yet accepted (default 128): more are closed at once and counted as refused
   * (ERR_LIMIT_REACHED, limit 'maxPending'). The connecting side's connect() tries again until
   * its timeout, then says ERR_LISTENER_BUSY.
   */
  maxPending?: number;
  /**
   * Of maxPending, the most connections from one address (an IPv6 address: one /64 prefix) that
   * have not proved the token yet (default 8): more from it are closed at once (ERR_LIMIT_REACHED,
   * limit 'maxPendingPerAddress'), so that one address cannot take the others' places.
   */
  maxPendingPerAddress?: number;
  /** The least time between two 'refused' events, in ms (default 1000): refusals in between are counted into one report. */
  refusedIntervalMs?: number;
}

/** The events of a TcpListener and the arguments their listeners get (as a Listener's). */
export interface TcpListenerEvents {
  /** A link whose token exchange and handshake succeeded and that no pending accept() took. */
  connection: [link: Link];
  /**
   * Connections that failed TLS, the token exchange or their handshake, or went past a bound; they
   * were closed. Coalesced: `error` is the first of them, `report` counts them all by code and by
   * address (at most one event per refusedIntervalMs; the first after a quiet interval at once).
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

export interface TcpListener {
  /** Adds a listener for `event` (see TcpListenerEvents). */
  on<E extends keyof TcpListenerEvents>(event: E, listener: (...args: TcpListenerEvents[E]) => void): this;
  /** Adds a listener called once for `event`. */
  once<E extends keyof TcpListenerEvents>(event: E, listener: (...args: TcpListenerEvents[E]) => void): this;
  /** Removes a listener. */
  off<E extends keyof TcpListenerEvents>(event: E, listener: (...args: TcpListenerEvents[E]) => void): this;
  /** Same as on(). */
  addListener<E extends keyof TcpListenerEvents>(event: E, listener: (...args: TcpListenerEvents[E]) => void): this;
  /** Same as off(). */
  removeListener<E extends keyof TcpListenerEvents>(event: E, listener: (...args: TcpListenerEvents[E]) => void): this;
}

interface Pending {
  socket: net.Socket;
  /** Where it comes from, as bounded by maxPendingPerAddress; undefined once it proved the token. */
  source: string | undefined;
  link: Link | undefined;
  /** Why it was given up (the handshake timeout, the listener's close), if it was. */
  givenUp: IpcError | undefined;
}

/**
 * A TCP (or TLS) address accepting links from other machines: `listen('tcp://HOST:PORT')`.
 * Each connection is handed over once its TLS, token exchange and handshake succeeded: to a
 * pending accept() first, else to 'connection' listeners, else it waits for accept() /
 * `for await`. A connection that fails any of them is closed and reported as 'refused' (with
 * ERR_AUTH_FAILED for a wrong token, ERR_TIMEOUT, ERR_LIMIT_REACHED, ...).
 */
export class TcpListener extends EventEmitter implements Disposable, AsyncIterable<Link> {
  /** The bound address, e.g. tcp://127.0.0.1:40123 (a port 0 in the URL given is the port picked). */
  readonly url: LinkUrl;
  /** The bound IP address and port. */
  readonly address: string;
  readonly port: number;
  #server: net.Server | undefined;
  readonly #token: Buffer;
  readonly #tls: tls.SecureContext | undefined;
  readonly #requestCert: boolean;
  readonly #limits: LinkLimits;
  readonly #handshakeTimeoutMs: number;
  readonly #maxPending: number;
  readonly #maxPendingPerAddress: number;
  readonly #challengeTimeoutMs: number;
  readonly #pending = new Set<Pending>();
  /** Connections not yet authenticated, by source (what maxPendingPerAddress bounds). */
  readonly #bySource = new Map<string, number>();
  readonly #reporter: RefusalReporter;
  readonly #ready = new Queue<Link>();
  readonly #waiters = new AcceptWaiters();

  /** @internal Use listen(url). */
  constructor(
    token: typeof kCreate,
    server: net.Server,
    url: LinkUrl,
    setup: {
      token: Buffer; tls: tls.SecureContext | undefined; requestCert: boolean; limits: LinkLimits;
      handshakeTimeoutMs: number; challengeTimeoutMs: number; maxPending: number; maxPendingPerAddress: number; refusedIntervalMs: number;
    },
  ) {
    super();
    if (token !== kCreate) throw new TypeError('use listen(url) to create a TcpListener');
    this.#server = server;
    this.url = url;
    const a = server.address() as net.AddressInfo;
    this.address = a.address;
    this.port = a.port;
    this.#token = setup.token;
    this.#tls = setup.tls;
    this.#requestCert = setup.requestCert;
    this.#limits = setup.limits;
    this.#handshakeTimeoutMs = setup.handshakeTimeoutMs;
    this.#maxPending = setup.maxPending;
    this.#maxPendingPerAddress = setup.maxPendingPerAddress;
    this.#challengeTimeoutMs = Math.min(setup.challengeTimeoutMs, setup.handshakeTimeoutMs);
    this.#reporter = new RefusalReporter(setup.refusedIntervalMs, (error, report) => {
      if (this.listenerCount('refused') > 0) this.emit('refused', error, report);
    });
    server.on('connection', (socket: net.Socket) => void this.#admit(socket));
    server.on('error', (e: Error) => {
      if (this.listenerCount('error') > 0) this.emit('error', e);
    });
  }

  get closed(): boolean {
    return this.#server === undefined;
  }

  async #admit(raw: net.Socket): Promise<void> {
    raw.on('error', () => {}); // reported through the steps below, or nowhere (a peer that reset)
    if (this.closed) {
      raw.destroy();
      return;
    }
    // Over a bound: closed at once and counted, nothing more (a flood costs a counter per connection).
    const source = sourceOf(raw.remoteAddress);
    const fromSource = this.#bySource.get(source) ?? 0;
    const limit = this.#pending.size + this.#ready.length >= this.#maxPending ? 'maxPending' : fromSource >= this.#maxPendingPerAddress ? 'maxPendingPerAddress' : undefined;
    if (limit) {
      raw.destroy();
      this.#reporter.note('ERR_LIMIT_REACHED', source, () => new IpcError(
        'ERR_LIMIT_REACHED',
        limit === 'maxPending'
          ? `listener ${this.url} closed a connection from ${source}: ${this.#maxPending} connections are already in their handshake or waiting for accept() (maxPending)`
          : `listener ${this.url} closed a connection from ${source}: ${this.#maxPendingPerAddress} connections from that address are already authenticating (maxPendingPerAddress)`,
        { limit },
      ));
      return;
    }
    const entry: Pending = { socket: raw, source, link: undefined, givenUp: undefined };
    this.#pending.add(entry);
    this.#bySource.set(source, fromSource + 1);
    const started = Date.now();
    // A short deadline until the peer's challenge arrived, the handshake timeout from then on.
    const overdue = (what: string, ms: number) => () =>
      this.#giveUp(entry, new IpcError('ERR_TIMEOUT', `listener ${this.url} closed a connection from ${raw.remoteAddress} that did not ${what} within ${ms} ms`));
    // The connection itself keeps the process alive, or listener.unref() lets it go.
    let timer = setTimeout(overdue(`complete TLS and send its challenge (challengeTimeoutMs)`, this.#challengeTimeoutMs), this.#challengeTimeoutMs).unref();
    const onChallenge = (): void => {
      clearTimeout(timer);
      timer = setTimeout(overdue('complete TLS, the token exchange and the handshake (handshakeTimeoutMs)', this.#handshakeTimeoutMs), Math.max(1, this.#handshakeTimeoutMs - (Date.now() - started))).unref();
    };
    let where = `${raw.remoteAddress}:${raw.remotePort}`;
    try {
      tuneSocket(raw);
      let remote;
      try {
        remote = remoteOf(raw, this.#tls !== undefined);
      } catch (e) {
        throw Object.assign(e as IpcError, { silent: true }); // gone before it said a word
      }
      where = formatLinkUrl('tcp', remote.address, remote.port).slice('tcp://'.length);
      const socket = this.#tls ? await this.#secure(raw) : raw;
      entry.socket = socket;
      const { leftover } = await authenticate(socket, AuthRole.Listener, this.#token, `peer at ${where}`, { onChallenge });
      if (entry.givenUp) throw entry.givenUp;
      this.#unsource(entry); // it proved the token: no longer one of its address's unauthenticated ones
      entry.link = new Link(kCreate, {
        fd: -1,
        tcp: { socket, leftover, remote },
        peerFrom: 'socket',
        verifyPeer: false,
        allowUids: [],
        helloFirst: true,
        handshakeTimeoutMs: Math.max(1, this.#handshakeTimeoutMs - (Date.now() - started)),
        peerName: `peer at ${where}`,
        limits: this.#limits,
      });
      await entry.link[kOpened]();
      if (entry.givenUp) throw entry.givenUp;
      this.#pending.delete(entry);
      this.#hand(entry.link);
    } catch (e) {
      this.#pending.delete(entry);
      this.#unsource(entry);
      if (entry.link) entry.link.close();
      else closeGracefully(entry.socket);
      const error = entry.givenUp ?? e;
      // A connection that sent nothing before it went (a port probe) is no news; nor is anything after close().
      if (!(error as { silent?: boolean }).silent && !this.closed) this.#refused(error, where, source);
    } finally {
      clearTimeout(timer);
    }
  }

  #unsource(entry: Pending): void {
    const source = entry.source;
    if (source === undefined) return;
    entry.source = undefined;
    const n = (this.#bySource.get(source) ?? 1) - 1;
    if (n > 0) this.#bySource.set(source, n);
    else this.#bySource.delete(source);
  }

  /** TLS on an accepted connection; with requestCert, the client's certificate must check out. */
  #secure(raw: net.Socket): Promise<tls.TLSSocket> {
    return new Promise<tls.TLSSocket>((resolve, reject) => {
      const socket = new tls.TLSSocket(raw, { isServer: true, secureContext: this.#tls!, requestCert: this.#requestCert, rejectUnauthorized: this.#requestCert });
      const onError = (e: Error): void => {
        socket.destroy();
        reject(new IpcError('ERR_AUTH_FAILED', `TLS with the connecting side failed: ${e.message}`, { cause: e }));
      };
      const onClose = (): void => reject(Object.assign(new IpcError('ERR_AUTH_FAILED', 'the connecting side closed the connection during TLS'), { silent: true }));
      socket.once('error', onError);
      socket.once('close', onClose);
      socket.once('secure', () => {
        socket.off('error', onError);
        socket.off('close', onClose);
        // A TLSSocket made from an accepted socket (not by a tls.Server) never sets `authorized`:
        // the handle's verifyError() says whether the client's certificate chained to `ca`.
        const verifyError = (socket as unknown as { ssl?: { verifyError?(): Error | null } }).ssl?.verifyError?.();
        const presented = Object.keys(socket.getPeerCertificate() ?? {}).length > 0;
        if (this.#requestCert && (verifyError !== null || !presented)) {
          const why = verifyError?.message ?? (presented ? 'it could not be verified' : 'it presented none');
          socket.destroy();
          reject(new IpcError('ERR_AUTH_FAILED', `the connecting side's TLS certificate did not check out: ${why}`));
          return;
        }
        resolve(socket);
      });
    });
  }

  /** Gives up on a connection still in its handshake: its next step throws `error`. */
  #giveUp(entry: Pending, error: IpcError): void {
    entry.givenUp ??= error;
    if (entry.link) entry.link.close();
    else entry.socket.destroy();
  }

  #refused(e: unknown, where: string, source: string): void {
    const err = e instanceof IpcError ? e : new IpcError('ERR_PEER_REFUSED', `a connection from ${where}: ${String((e as Error)?.message ?? e)}`, { cause: e });
    this.#reporter.note(err.code, source, () => err);
  }

  /** Connections refused since the listener started (reported or still gathered for the next report). */
  get refusedCount(): number {
    return this.#reporter.total;
  }

  #hand(link: Link): void {
    if (this.closed) {
      link.close();
      return;
    }
    if (this.#waiters.hand(link)) return;
    if (this.#ready.length === 0 && this.listenerCount('connection') > 0) this.emit('connection', link);
    else this.#ready.push(link);
  }

  /** The next connection; `options`: give up on a signal (AbortError) or after a timeout (ERR_TIMEOUT). */
  accept(options?: WaitOptions): Promise<Link> {
    const link = this.#ready.shift();
    if (link) return Promise.resolve(link);
    if (this.closed) return Promise.reject(new IpcError('ERR_LINK_CLOSED', `the listener ${this.url} is closed`));
    return this.#waiters.wait(options);
  }

  /** Yields connections until the listener is closed. */
  [Symbol.asyncIterator](): AsyncIterator<Link> {
    return acceptUntilClosed(() => this.accept());
  }

  /** Keep the process alive while this listener is open (the default). */
  ref(): this {
    this.#server?.ref();
    return this;
  }
  /** Let the process exit even though this listener is open. */
  unref(): this {
    this.#server?.unref();
    return this;
  }

  /**
   * Stops listening. Links already handed out stay open; connections still in their handshake,
   * and links never accepted, are closed.
   */
  close(): void {
    const server = this.#server;
    if (!server) return;
    this.#server = undefined;
    server.close();
    const closed = new IpcError('ERR_LINK_CLOSED', `the listener ${this.url} is closed`);
    this.#reporter.flush(); // what was gathered is still told
    for (const p of this.#pending) this.#giveUp(p, closed);
    for (const l of this.#ready.drain()) l.close();
    this.#waiters.rejectAll(closed);
    this.emit('close');
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * listen() for a tcp:// or tls:// URL (listener.ts hands it over): binds exactly the URL's
 * address and resolves with the listener once it listens. Without a token (options.token or
 * CUDA_IPC_TOKEN) it rejects with ERR_AUTH_FAILED, having bound nothing.
 */
export async function listenTcp(urlText: LinkUrl, options: TcpListenOptions = {}): Promise<TcpListener> {
  const o = checkObject<TcpListenOptions>(options, 'options') ?? {};
  const url = parseLinkUrl(urlText, 'listen');
  const limits = linkLimits(o, 'options');
  const handshakeTimeoutMs = optionalInteger(o.handshakeTimeoutMs, 'options.handshakeTimeoutMs', 10_000, 1);
  const maxPending = optionalInteger(o.maxPending, 'options.maxPending', 128, 1);
  const maxPendingPerAddress = optionalInteger(o.maxPendingPerAddress, 'options.maxPendingPerAddress', 8, 1);
  const challengeTimeoutMs = optionalInteger(o.challengeTimeoutMs, 'options.challengeTimeoutMs', 2_000, 1);
  const refusedIntervalMs = optionalInteger(o.refusedIntervalMs, 'options.refusedIntervalMs', REFUSED_INTERVAL_MS, 0);
  const backlog = optionalInteger(o.backlog, 'options.backlog', 128, 1);
  const tlsOptions = tlsOptionsFor(url, o, 'listen');
  let secureContext: tls.SecureContext | undefined;
  if (tlsOptions) {
    if (tlsOptions.cert === undefined) throw new TypeError('listen: a tls:// listener needs options.tls.cert and options.tls.key (its certificate)');
    secureContext = tls.createSecureContext(tlsContextOptions(tlsOptions, 'listen'));
  }
  const token = resolveToken(o.token, 'listen');
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    const onError = (e: Error & { code?: string }): void => {
      server.close();
      reject(
        e.code === 'EADDRINUSE'
          ? new IpcError('ERR_ADDRESS_IN_USE', `listen: another socket is bound to ${urlText} already; pick another port (0: any free one) or close that listener`, { cause: e })
          : e.code === 'EADDRNOTAVAIL'
            ? new IpcError('ERR_UNSUPPORTED', `listen: no interface of this machine has the address of ${urlText} (EADDRNOTAVAIL)`, { cause: e })
            : e,
      );
    };
    server.once('error', onError);
    server.listen({ host: url.host, port: url.port, backlog }, () => {
      server.off('error', onError);
      resolve();
    });
  });
  const a = server.address() as net.AddressInfo;
  return new TcpListener(kCreate, server, formatLinkUrl(url.scheme, a.address, a.port), {
    token,
    tls: secureContext,
    requestCert: tlsOptions?.requestCert === true,
    limits,
    handshakeTimeoutMs,
    challengeTimeoutMs,
    maxPending,
    maxPendingPerAddress,
    refusedIntervalMs,
  });
}

/**
 * The source a connection from `address` counts against (maxPendingPerAddress): an IPv4 address
 * (also when written IPv4-mapped), or an IPv6 address's /64 prefix, as one host usually holds a
 * whole /64 and could otherwise change its address for every connection.
 */
export function sourceOf(address: string | undefined): string {
  if (!address) return 'unknown';
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1]!;
  if (!address.includes(':')) return address;
  const [head = '', tail] = address.split('%')[0]!.split('::');
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const width = (g: string[]): number => g.reduce((n, x) => n + (x.includes('.') ? 2 : 1), 0);
  const groups = tail === undefined ? h : [...h, ...Array<string>(Math.max(0, 8 - width(h) - width(t))).fill('0'), ...t];
  return `${groups.slice(0, 4).map((g) => (g.includes('.') ? g : parseInt(g, 16).toString(16))).join(':')}::/64`;
}
