// listen('tcp://HOST:PORT') and listen('tls://HOST:PORT'): links from other machines
// (PROTOCOL.md 2.3). The listener binds exactly the address of its URL (port 0: any free one;
// `url` says which). Each connection runs TLS (tls://), the token exchange and the HELLOs within
// the handshake timeout; the connections still doing so are bounded (maxPending), and one that
// fails is closed and reported as 'refused', as the Unix listener reports refused uids. A
// connection that sends nothing at all before it closes (a port probe) is dropped silently.
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

/** Options of listen(url) for a tcp:// or tls:// URL; the LinkOptions bound each accepted link. */
export interface TcpListenOptions extends TcpLinkOptions {
  /** The kernel's queue of connections not yet accepted (default 128). */
  backlog?: number;
  /** A connection must finish TLS, the token exchange and its handshake in this time (default 10 s). */
  handshakeTimeoutMs?: number;
  /**
   * Connections held at once that are still in TLS, the token exchange or the handshake, or not
   * yet accepted (default 128): more are closed at once and reported as 'refused'
   * (ERR_LIMIT_REACHED, limit 'maxPending').
   */
  maxPending?: number;
}

/** The events of a TcpListener and the arguments their listeners get (as a Listener's). */
export interface TcpListenerEvents {
  /** A link whose token exchange and handshake succeeded and that no pending accept() took. */
  connection: [link: Link];
  /** A connection that failed TLS, the token exchange or its handshake, or went past maxPending; it was closed. */
  refused: [error: IpcError];
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
  readonly #pending = new Set<Pending>();
  readonly #ready = new Queue<Link>();
  readonly #waiters = new AcceptWaiters();

  /** @internal Use listen(url). */
  constructor(
    token: typeof kCreate,
    server: net.Server,
    url: LinkUrl,
    setup: { token: Buffer; tls: tls.SecureContext | undefined; requestCert: boolean; limits: LinkLimits; handshakeTimeoutMs: number; maxPending: number },
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
    if (this.#pending.size + this.#ready.length >= this.#maxPending) {
      raw.destroy();
      this.#refused(new IpcError('ERR_LIMIT_REACHED', `listener ${this.url} closed a connection: ${this.#maxPending} connections are already in their handshake or waiting for accept() (maxPending)`, { limit: 'maxPending' }));
      return;
    }
    const entry: Pending = { socket: raw, link: undefined, givenUp: undefined };
    this.#pending.add(entry);
    const timer = setTimeout(() => {
      this.#giveUp(entry, new IpcError('ERR_TIMEOUT', `listener ${this.url} closed a connection from ${raw.remoteAddress} that did not complete TLS, the token exchange and the handshake within ${this.#handshakeTimeoutMs} ms`));
    }, this.#handshakeTimeoutMs).unref(); // the connection itself keeps the process alive, or listener.unref() lets it go
    const started = Date.now();
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
      const { leftover } = await authenticate(socket, AuthRole.Listener, this.#token, `peer at ${where}`);
      if (entry.givenUp) throw entry.givenUp;
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
      if (entry.link) entry.link.close();
      else closeGracefully(entry.socket);
      const error = entry.givenUp ?? e;
      // A connection that sent nothing before it went (a port probe) is no news; nor is anything after close().
      if (!(error as { silent?: boolean }).silent && !this.closed) this.#refused(error, where);
    } finally {
      clearTimeout(timer);
    }
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
        if (this.#requestCert && !socket.authorized) {
          socket.destroy();
          reject(new IpcError('ERR_AUTH_FAILED', `the connecting side's TLS certificate did not check out: ${String(socket.authorizationError)}`));
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

  #refused(e: unknown, where?: string): void {
    const err = e instanceof IpcError ? e : new IpcError('ERR_PEER_REFUSED', `${where ? `a connection from ${where}: ` : ''}${String((e as Error)?.message ?? e)}`, { cause: e });
    if (this.listenerCount('refused') > 0) this.emit('refused', err);
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
    maxPending,
  });
}
