// connect('tcp://HOST:PORT') and connect('tls://HOST:PORT'): a link to a listener on another
// machine (PROTOCOL.md 2.3). The connection is opened (waiting for the listener to appear, as
// connect(name) does), tuned (keepalive, no Nagle), wrapped in TLS for tls://, authenticated with
// the shared token, and handed to a Link, which resolves once the HELLOs crossed.
import net from 'node:net';
import tls from 'node:tls';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../../errors.js';
import { abortError, checkTimeout } from '../../abort.js';
import { checkObject, checkSignal, invalidArgType, invalidArgValue } from '../../arg-errors.js';
import { Link, kCreate, kOpened } from '../connection/link.js';
import { linkLimits, type LinkOptions } from '../connection/link-options.js';
import type { RemoteEndpoint } from '../connection/link-types.js';
import { formatLinkUrl, parseLinkUrl, type LinkUrl, type ParsedLinkUrl } from '../transport/link-url.js';
import { AuthRole, authenticate, resolveToken } from '../transport/tcp-auth.js';
import { closeGracefully } from '../transport/tcp-transport.js';

/** TLS settings of a `tls://` link (node:tls; PEM strings or Buffers). */
export interface TlsLinkOptions {
  /** This side's certificate chain: required to listen, optional to connect (a client certificate). */
  cert?: string | Buffer;
  /** The private key of `cert`. */
  key?: string | Buffer;
  /** The CA certificate(s) the peer's certificate must chain to (default: the system's). */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Connect: the name the listener's certificate must carry, when it is not the URL's host. */
  servername?: string;
  /** Listen: connecting sides must present a certificate that `ca` signed (mutual TLS). */
  requestCert?: boolean;
}

/** What TCP links take beside LinkOptions, on both sides. */
export interface TcpLinkOptions extends LinkOptions {
  /**
   * The shared secret both sides prove (PROTOCOL.md 2.3), at least 16 bytes: a string (as UTF-8)
   * or bytes. Default: the CUDA_IPC_TOKEN environment variable. It never crosses the wire;
   * without one, listen() and connect() fail with ERR_AUTH_FAILED before sending anything.
   */
  token?: string | Uint8Array;
  /** TLS settings; only with a tls:// URL. */
  tls?: TlsLinkOptions;
}

/** Options of connect(url) for a tcp:// or tls:// URL. */
export interface TcpConnectOptions extends TcpLinkOptions {
  /**
   * How long to wait, in ms, for the listener to appear, for the authentication and for the
   * handshake (default 10 s). A refused connection (nobody listens yet), and one the listener
   * closes before this side could prove the token (it has no room: its bounds of pending
   * connections), are tried again with a growing pause (5 ms to 250 ms) until then; past it,
   * ERR_NO_LISTENER (nobody listened), ERR_LISTENER_BUSY (the listener kept closing the
   * connections) or ERR_TIMEOUT (a step got no answer). 0: try once, and fail at once with
   * ERR_NO_LISTENER when nobody listens, ERR_LISTENER_BUSY when the listener had no room.
   */
  timeout?: number;
  /** Gives up when it aborts: the promise rejects with an AbortError (code ABORT_ERR). */
  signal?: AbortSignal;
}

/** TCP keepalive (PROTOCOL.md 1.1): probes start after 10 s of silence. */
const KEEPALIVE_IDLE_MS = 10_000;

/**
 * Keepalive and no Nagle, as PROTOCOL.md 1.1 asks. Node sets the idle time; the probe interval
 * and count are libuv's (1 s and 10 since libuv 1.46, measured with getsockopt on Node 20.20),
 * so a peer whose machine vanished is noticed within about 20 s.
 */
export function tuneSocket(socket: net.Socket): void {
  socket.setNoDelay(true);
  socket.setKeepAlive(true, KEEPALIVE_IDLE_MS);
}

/** Where the peer of `socket` is; ERR_PEER_GONE when it is no longer connected. */
export function remoteOf(socket: net.Socket, isTls: boolean): RemoteEndpoint {
  const { remoteAddress: address, remotePort: port, remoteFamily: family } = socket;
  if (address === undefined || port === undefined) throw new IpcError('ERR_PEER_GONE', 'the TCP connection closed before the link was made');
  return { address, port, family: family === 'IPv6' ? 'IPv6' : 'IPv4', tls: isTls };
}

/** The secure context options of `o` for node:tls, checked. */
export function tlsContextOptions(o: TlsLinkOptions, what: string): tls.SecureContextOptions {
  const pem = (v: unknown, name: string): void => {
    if (v !== undefined && typeof v !== 'string' && !Buffer.isBuffer(v) && !(Array.isArray(v) && name === 'ca' && v.every((x) => typeof x === 'string' || Buffer.isBuffer(x)))) {
      throw invalidArgType(`${what}: options.tls.${name} must be PEM text (a string or a Buffer)`);
    }
  };
  pem(o.cert, 'cert');
  pem(o.key, 'key');
  pem(o.ca, 'ca');
  if ((o.cert === undefined) !== (o.key === undefined)) throw invalidArgValue(`${what}: options.tls needs both cert and key, or neither`);
  return { ...(o.cert !== undefined ? { cert: o.cert, key: o.key } : {}), ...(o.ca !== undefined ? { ca: o.ca } : {}) };
}

/** The TLS options of a link to or from `url`: undefined for tcp://; TypeError for tls options on tcp://. */
export function tlsOptionsFor(url: ParsedLinkUrl, options: TcpLinkOptions, what: string): TlsLinkOptions | undefined {
  const o = checkObject<TlsLinkOptions>(options.tls, 'options.tls');
  if (url.scheme === 'tcp') {
    if (o !== undefined) throw invalidArgValue(`${what}: options.tls is given with a tcp:// URL; write tls:// to run the link inside TLS`);
    return undefined;
  }
  return o ?? {};
}

const RETRY_FIRST_MS = 5;
const RETRY_MOST_MS = 250;

/** A connected (and for tls://, TLS-established) socket to `url`, or the error that says why not. */
function open(url: ParsedLinkUrl, tlsOptions: TlsLinkOptions | undefined, cancel: AbortSignal): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    const socket: net.Socket = tlsOptions
      ? tls.connect({
          host: url.host,
          port: url.port,
          ...tlsContextOptions(tlsOptions, 'connect'),
          ...(tlsOptions.servername !== undefined ? { servername: tlsOptions.servername } : url.family === 0 ? { servername: url.host } : {}),
        })
      : net.connect({ host: url.host, port: url.port });
    const onAbort = (): void => {
      socket.destroy();
      reject(cancel.reason);
    };
    const done = (): void => {
      socket.off('error', onError);
      cancel.removeEventListener('abort', onAbort);
    };
    let connected = false;
    if (tlsOptions) socket.once('connect', () => (connected = true));
    const onError = (e: Error & { code?: string }): void => {
      done();
      socket.destroy();
      // The TCP connection was made and closed during TLS: as a listener with no room does.
      if (connected && (e.code === 'ECONNRESET' || e.code === 'EPIPE')) {
        reject(new IpcError('ERR_LISTENER_BUSY', `the listener at ${formatLinkUrl(url.scheme, url.host, url.port)} closed the connection during TLS, before this side could prove the token: it is at its bound of connections still authenticating, or it is not a cuda-ipc listener`, { cause: e }));
        return;
      }
      reject(e);
    };
    socket.once(tlsOptions ? 'secureConnect' : 'connect', () => {
      done();
      resolve(socket);
    });
    socket.on('error', onError);
    cancel.addEventListener('abort', onAbort, { once: true });
  });
}

/** What a failure to open the connection to `url` means to the caller. */
function openError(e: unknown, url: string): IpcError {
  const code = (e as { code?: string })?.code;
  if (code === 'ECONNREFUSED') return new IpcError('ERR_NO_LISTENER', `connect: nothing listens at ${url} (connection refused); start the listening process first`, { cause: e });
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return new IpcError('ERR_NO_LISTENER', `connect: the host of ${url} is not known (${code})`, { cause: e });
  if (code === 'ETIMEDOUT' || code === 'EHOSTUNREACH' || code === 'ENETUNREACH') return new IpcError('ERR_NO_LISTENER', `connect: ${url} cannot be reached (${code})`, { cause: e });
  if (typeof code === 'string' && (code.startsWith('ERR_TLS') || code.includes('CERT') || code.includes('SIGNATURE') || code === 'DEPTH_ZERO_SELF_SIGNED_CERT')) {
    return new IpcError('ERR_AUTH_FAILED', `connect: the TLS certificate of ${url} did not check out (${code}): ${(e as Error).message}; give its CA as options.tls.ca`, { cause: e });
  }
  return new IpcError('ERR_NO_LISTENER', `connect: could not connect to ${url}: ${String((e as Error)?.message ?? e)}`, { cause: e });
}

/**
 * connect() for a tcp:// or tls:// URL (listener.ts hands it over): resolves once the token was
 * proved both ways and the HELLOs crossed.
 */
export async function connectTcp(urlText: LinkUrl, options: TcpConnectOptions = {}): Promise<Link> {
  const o = checkObject<TcpConnectOptions>(options, 'options') ?? {};
  const url = parseLinkUrl(urlText, 'connect');
  const limits = linkLimits(o, 'options');
  const signal = checkSignal(o.signal);
  const given0 = checkTimeout(o.timeout, 'options.timeout') ?? 10_000;
  // 0: one try to connect; the token exchange and the handshake still get the default time.
  const once = given0 === 0;
  const timeoutMs = once ? 10_000 : given0;
  const tlsOptions = tlsOptionsFor(url, o, 'connect');
  // Before anything goes out: no token, nothing sent.
  const token = resolveToken(o.token, 'connect');
  const shown = formatLinkUrl(url.scheme, url.host, url.port);
  if (signal?.aborted) throw abortError(signal.reason, 'connect');
  const deadline = Date.now() + timeoutMs;
  const peerName = `listener at ${shown}`;
  // Where it stands, for the error the deadline gives.
  let refused: IpcError | undefined; // the last try found nobody listening
  let busy: IpcError | undefined; // the last try was closed by the listener before authentication
  let busyTries = 0;
  let stage = 'connect';
  const timedOut = (): IpcError => {
    if (refused) return new IpcError('ERR_NO_LISTENER', `connect: nothing listens at ${shown} (connection refused), and no listener appeared within ${timeoutMs} ms (the timeout option); start the listening process first`, { cause: refused });
    if (busy) {
      return new IpcError(
        'ERR_LISTENER_BUSY',
        `connect: the listener at ${shown} closed ${busyTries} connection${busyTries === 1 ? '' : 's'} before this side could prove the token and stayed so for ${timeoutMs} ms (the timeout option): ` +
          'it is at its bound of connections still authenticating (maxPending, maxPendingPerAddress; a flood from this address?), or it is not a cuda-ipc listener',
        { cause: busy },
      );
    }
    return new IpcError('ERR_TIMEOUT', `connect: ${shown} did not complete the link within ${timeoutMs} ms (the timeout option): no answer to the ${stage}`);
  };
  // One signal for every step: the caller's, or the deadline.
  const cancel = new AbortController();
  const timer = setTimeout(() => cancel.abort(timedOut()), Math.max(0, timeoutMs));
  const onAbort = (): void => cancel.abort(abortError(signal!.reason, 'connect'));
  signal?.addEventListener('abort', onAbort, { once: true });
  const given = (e: unknown): unknown => (cancel.signal.aborted ? cancel.signal.reason : e);
  const pauseBeforeRetry = async (ms: number): Promise<void> => {
    try {
      await sleep(Math.min(ms, Math.max(0, deadline - Date.now())), undefined, { signal: cancel.signal });
    } catch {
      throw cancel.signal.reason;
    }
  };
  let socket: net.Socket | undefined;
  try {
    let pause = RETRY_FIRST_MS;
    let leftover: Buffer | undefined;
    for (;;) {
      stage = 'connection';
      try {
        socket = await open(url, tlsOptions, cancel.signal);
      } catch (e) {
        if (cancel.signal.aborted) throw cancel.signal.reason;
        if (e instanceof IpcError && e.code === 'ERR_LISTENER_BUSY' && !once) {
          busy = e;
          busyTries++;
          refused = undefined;
          if (deadline - Date.now() <= 0) throw timedOut();
          await pauseBeforeRetry(pause);
          pause = Math.min(pause * 2, RETRY_MOST_MS);
          continue;
        }
        if (e instanceof IpcError) throw e;
        const error = openError(e, shown);
        // Nobody there yet: wait for the listener, until the deadline (as connect(name) does).
        if ((e as { code?: string }).code !== 'ECONNREFUSED' || once) throw error;
        refused = error;
        busy = undefined;
        if (deadline - Date.now() <= 0) throw timedOut();
        await pauseBeforeRetry(pause);
        pause = Math.min(pause * 2, RETRY_MOST_MS);
        continue;
      }
      refused = undefined;
      tuneSocket(socket);
      const s = socket;
      const onCancel = (): void => void s.destroy();
      cancel.signal.addEventListener('abort', onCancel, { once: true });
      stage = 'token exchange';
      try {
        ({ leftover } = await authenticate(socket, AuthRole.Connector, token, peerName));
        break;
      } catch (e) {
        if (cancel.signal.aborted) throw cancel.signal.reason;
        // Inside TLS, a listener with no room never gets this far (it closes before TLS): one that
        // closes the connection right after TLS, before its challenge, refused this side's certificate.
        if (tlsOptions && e instanceof IpcError && e.code === 'ERR_LISTENER_BUSY') {
          throw new IpcError(
            'ERR_AUTH_FAILED',
            `connect: the listener at ${shown} closed the connection right after TLS, before its challenge: it requires a client certificate its CA signed ` +
              `(options.tls.cert and key${tlsOptions.cert === undefined ? '; none was given' : '; this one did not check out'})`,
            { cause: e },
          );
        }
        // Closed before this side proved anything: the listener had no room (or was flooded); try again until the deadline.
        if (!(e instanceof IpcError && e.code === 'ERR_LISTENER_BUSY') || once) throw e;
        busy = e;
        busyTries++;
        socket.destroy();
        socket = undefined;
        if (deadline - Date.now() <= 0) throw timedOut();
        await pauseBeforeRetry(pause);
        pause = Math.min(pause * 2, RETRY_MOST_MS);
      } finally {
        cancel.signal.removeEventListener('abort', onCancel);
      }
    }
    busy = undefined;
    stage = 'link handshake (HELLO)';
    if (cancel.signal.aborted) throw cancel.signal.reason;
    const link = new Link(kCreate, {
      fd: -1,
      tcp: { socket, leftover, remote: remoteOf(socket, tlsOptions !== undefined) },
      peerFrom: 'socket',
      verifyPeer: false,
      allowUids: [],
      helloFirst: true,
      handshakeTimeoutMs: Math.max(1, deadline - Date.now()),
      peerName,
      limits,
    });
    socket = undefined; // the link's now
    const closeLink = (): void => link.close();
    cancel.signal.addEventListener('abort', closeLink, { once: true });
    try {
      await link[kOpened]();
    } catch (e) {
      throw given(e);
    } finally {
      cancel.signal.removeEventListener('abort', closeLink);
    }
    if (cancel.signal.aborted) {
      link.close();
      throw cancel.signal.reason;
    }
    return link;
  } catch (e) {
    if (socket) closeGracefully(socket);
    throw given(e);
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}
