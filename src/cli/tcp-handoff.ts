// The two-terminal example across machines: `cuda-ipc produce --listen tcp://HOST:PORT` on one,
// `cuda-ipc consume tcp://HOST:PORT` on the other, both with the same token (CUDA_IPC_TOKEN or
// --token-file; never on the command line, where other users see it in the process list). Host
// memory: a TCP link carries a copy of the producer's buffer; the consumer verifies it, doubles
// its copy and sends it back (another copy); the producer verifies what came back and that its own
// buffer is unchanged, which is what "copied" means. Device memory, where both machines have a GPU
// (the consumer says whether it has one first): a DeviceArray moved over NCCL into memory of the
// consumer's own GPU, doubled there and sent back the same way.
import { randomBytes } from 'node:crypto';
import type { Stats } from 'node:fs';
import { IpcError } from '../errors.js';
import { readRegularFile } from '../safe-files.js';
import { HostBuffer } from '../host/index.js';
import { Device } from '../cuda/device.js';
import { BuiltinKernels } from '../cuda/builtins.js';
import { DeviceArray } from '../arrays/device-array.js';
import { connect, listen, setLinkWorkingDevice, type Link } from '../link/index.js';
import { parseLinkUrl, type LinkUrl } from '../link/transport/link-url.js';
import { MIN_TOKEN_BYTES, TOKEN_ENV } from '../link/transport/tcp-auth.js';
import { countOption, secondsOption, stringValue, UsageError, type ParsedArgs } from './args.js';
import { checkDeviceOrdinal, deviceChoice, whyNoGpu } from './availability.js';
import { fillPattern, findMismatch, firstFive, patternValue } from './pattern.js';
import { failedPeerError, failedReply, peerFailure, tellPeer, type Failed } from './peer-failure.js';
import { terminalSafe } from './terminal-text.js';
import { refusedLine, wrongToken } from './refused-text.js';

/** The consumer's first message: whether it can take device memory (a GPU and NCCL), and why not. */
interface Ready {
  device: boolean;
  why?: string;
}
/** What the producer sends: its buffer (it arrives as a copy) or its array (moved over NCCL), and how many float32. */
type Handoff = { buffer: HostBuffer; elements: number } | { array: DeviceArray<'float32'>; elements: number } | Failed;
/** What the consumer answers: its doubled copy, or why it failed (the error's code too, where it has one). */
type Reply = { ok: true; buffer: HostBuffer } | { ok: true; array: DeviceArray<'float32'> } | { ok: false; message: string; code?: string };

/** Most bytes a token file may hold: it holds one token. */
const TOKEN_FILE_MAX = 4096;

const floats = (b: HostBuffer) => new Float32Array(b.bytes.buffer, b.bytes.byteOffset, Math.floor(b.byteLength / 4));

/** `cuda-ipc token`: a fresh random token (32 bytes, base64url), for CUDA_IPC_TOKEN or a token file. */
export function printToken(): number {
  console.log(randomBytes(32).toString('base64url'));
  return 0;
}

/**
 * The token given by --token-file FILE (its text, surrounding whitespace removed), or undefined to
 * take CUDA_IPC_TOKEN. The file must be a regular file (not a symbolic link, a FIFO or a device:
 * opened with O_NOFOLLOW | O_NONBLOCK, checked on the open fd), owned by this user and neither
 * readable nor writable by group or others: a token another user can read lets them in, and one
 * another user owns or can write is theirs to choose (ERR_FILE_UNSAFE, saying the chmod/chown).
 */
function tokenFromArgs(args: ParsedArgs): string | undefined {
  const path = stringValue(args, 'token-file');
  if (path === undefined) return undefined;
  let bytes: Buffer;
  let st: Stats;
  try {
    ({ bytes, stats: st } = readRegularFile(path, { maxBytes: TOKEN_FILE_MAX, what: 'the token file' }));
  } catch (e) {
    if (e instanceof IpcError) throw e;
    throw new IpcError('ERR_AUTH_FAILED', `cannot read the token file ${path}: ${(e as Error).message}`, { cause: e });
  }
  const uid = process.getuid?.();
  if (uid !== undefined && st.uid !== uid) {
    throw new IpcError('ERR_FILE_UNSAFE', `the token file ${path} belongs to uid ${st.uid}, not to this user (uid ${uid}): whoever owns it chooses the token. ` +
      `Use a token file of your own, or take this one: chown ${uid} ${path}; chmod 600 ${path}`);
  }
  if ((st.mode & 0o077) !== 0) {
    throw new IpcError('ERR_FILE_UNSAFE', `the token file ${path} may be read or written by other users (mode ${(st.mode & 0o777).toString(8)}): ` +
      `the token is a password. Run chmod 600 ${path} (and use a fresh token if others could read it: (umask 077; cuda-ipc token > ${path}))`);
  }
  const token = bytes.toString('utf8').trim();
  if (token === '') throw new IpcError('ERR_AUTH_FAILED', `the token file ${path} is empty; put a token in it: (umask 077; cuda-ipc token > ${path})`);
  return token;
}

/**
 * The token of this side, from --token-file or CUDA_IPC_TOKEN, checked here so that the hints
 * name the CLI's ways (the library's name its `token` option). ERR_AUTH_FAILED without one.
 */
function cliToken(args: ParsedArgs): string {
  const fromFile = tokenFromArgs(args);
  const token = fromFile ?? process.env[TOKEN_ENV] ?? '';
  const from = fromFile !== undefined ? `the token file ${stringValue(args, 'token-file')}` : TOKEN_ENV;
  if (token === '') {
    throw new IpcError('ERR_AUTH_FAILED', `a TCP link needs a token and none was given: set ${TOKEN_ENV} or pass --token-file FILE, the same secret on both sides ` +
      `(\`cuda-ipc token\` prints a fresh one: export ${TOKEN_ENV}=$(cuda-ipc token), or (umask 077; cuda-ipc token > FILE)). Nothing was sent`);
  }
  const bytes = Buffer.byteLength(token, 'utf8');
  if (bytes < MIN_TOKEN_BYTES) {
    throw new IpcError('ERR_AUTH_FAILED', `the token in ${from} is ${bytes} bytes; a token is at least ${MIN_TOKEN_BYTES} bytes (\`cuda-ipc token\` prints a fresh one). Nothing was sent`);
  }
  return token;
}

/** The library's ERR_AUTH_FAILED (a token that is not the peer's) in the CLI's words. */
function cliAuthError(e: unknown, peer: string): unknown {
  if ((e as { code?: string }).code !== 'ERR_AUTH_FAILED') return e;
  return new IpcError('ERR_AUTH_FAILED', `${peer} did not prove the token: the two sides hold different tokens; give both the same one (${TOKEN_ENV} or --token-file FILE)`, { cause: e });
}

/**
 * The URL of --listen or consume's argument, checked before anything waits: tcp:// only in the
 * CLI; a bad URL is a usage error (exit 2) saying what is wrong and the forms it takes.
 */
function cliUrl(value: string, what: '--listen' | 'consume'): LinkUrl {
  try {
    parseLinkUrl(value, what === '--listen' ? 'listen' : 'connect');
  } catch (e) {
    const why = (e as Error).message.replace(/^(listen|connect): /, '');
    throw new UsageError(what === '--listen' ? `--listen ${why}` : why);
  }
  if (value.startsWith('tls://')) {
    throw new UsageError(`${what} takes tcp://HOST:PORT, e.g. tcp://0.0.0.0:5000 (tls:// needs certificates: use listen()/connect() with their tls options); got '${terminalSafe(value)}'`);
  }
  return value as LinkUrl;
}

export async function produceOverTcp(args: ParsedArgs, listenAt: string): Promise<number> {
  if (stringValue(args, 'out') !== undefined) throw new UsageError('give --out FILE (this machine) or --listen tcp://HOST:PORT (another machine), not both');
  if (args.values.force !== undefined) throw new UsageError('--force goes with --out FILE; --listen writes no file');
  const url = cliUrl(listenAt, '--listen');
  const n = countOption(args, 'elements', 1 << 20);
  const timeoutMs = secondsOption(args, 'timeout', 600);
  const dev = deviceChoice(args);
  const ordinal = dev.ordinal;
  checkDeviceOrdinal(ordinal, dev.explicit, 'share host memory instead', dev.option);
  const token = cliToken(args);
  const noGpu = whyNoGpu(ordinal);
  const listener = await listen(url, { token });
  let link: Link<Ready | Reply, Handoff> | undefined;
  try {
    const any = /^tcp:\/\/(0\.0\.0\.0|\[::\]):/.test(listener.url);
    console.log(`producer ${process.pid}: ${n} float32, ${noGpu ? `in host memory (no GPU here: ${noGpu})` : `on device ${ordinal} if the consumer has a GPU too`}`);
    console.log(
      `listening at ${listener.url}; on the other machine, with the same token (${TOKEN_ENV} or --token-file): ` +
        `cuda-ipc consume ${any ? `tcp://THIS-MACHINE:${listener.port}` : listener.url}`,
    );
    // Refused connections are printed as they come (coalesced); one that proved another token ends the producer too.
    const stop = new AbortController();
    const wrong = new Promise<never>((_, reject) => {
      listener.on('refused', (error, report) => {
        console.error(`producer: ${refusedLine(error, report)}`);
        if (wrongToken(report)) {
          reject(new IpcError('ERR_AUTH_FAILED', `a consumer connected with another token (${error.code === 'ERR_AUTH_FAILED' ? error.message : 'see above'}); give both sides the same token (${TOKEN_ENV} or --token-file)`));
          stop.abort();
        }
      });
    });
    wrong.catch(() => {});
    try {
      link = (await Promise.race([listener.accept({ timeout: timeoutMs, signal: stop.signal }), wrong])) as Link<Ready | Reply, Handoff>;
    } catch (e) {
      if (stop.signal.aborted) await wrong;
      if ((e as IpcError).code === 'ERR_TIMEOUT') throw new IpcError('ERR_TIMEOUT', `no consumer connected within ${timeoutMs / 1000} s: run \`cuda-ipc consume ${listener.url}\` with the same token`);
      throw e;
    }
    listener.close(); // one consumer
    const at = `${link.remote!.address} port ${link.remote!.port}`;
    try {
      const ready = await link.receive<Ready | Reply>({ timeout: timeoutMs });
      if ('ok' in ready) return consumerFailed(ready);
      if (noGpu === undefined && ready.device) return await produceDevice(link, at, Device.get(ordinal), n);
      if (noGpu === undefined) console.log(`producer: the consumer at ${at} takes no device memory (${ready.why ?? 'no reason given'}); sharing host memory`);
      return await produceHost(link, at, n);
    } catch (e) {
      await tellPeer(link, e); // the consumer prints the same cause
      throw e;
    }
  } finally {
    link?.close();
    listener.close();
  }
}

/** The consumer's failure, printed as the consumer prints it (its code, its message): exit 1. */
function consumerFailed(reply: Reply | Ready): number {
  const r = reply as { message?: unknown; code?: unknown };
  const failure = peerFailure({ failed: { v: 1, code: r.code, message: typeof r.message === 'string' ? r.message : 'no reason given' } })!;
  console.error(terminalSafe(`producer: the consumer failed: ${failure.code ? `[${failure.code}] ` : ''}${failure.message}`));
  return 1;
}

async function produceHost(link: Link<Ready | Reply, Handoff>, at: string, n: number): Promise<number> {
  using buffer = HostBuffer.allocate(n * 4);
  const values = floats(buffer);
  fillPattern(values);
  console.log(`producer: consumer connected from ${at}; sending ${firstFive(values)}, ... in host memory (a TCP link carries a copy of its bytes)`);
  link.send({ buffer, elements: n });
  const reply = await link.receive<Reply>();
  if (!reply.ok) return consumerFailed(reply);
  if (!('buffer' in reply)) throw new IpcError('ERR_FRAME_INVALID', 'the consumer answered host memory with device memory');
  try {
    const back = floats(reply.buffer);
    const bad = back.length === n ? findMismatch(back, 2) : 0;
    if (bad >= 0) {
      console.error(`producer: element ${bad} of the copy that came back is ${back[bad]}, expected ${patternValue(bad) * 2}`);
      return 1;
    }
    const mine = findMismatch(values);
    if (mine >= 0) {
      console.error(`producer: element ${mine} of this side's buffer changed (${values[mine]}): a TCP link must copy, not share`);
      return 1;
    }
    console.log(`producer: the consumer doubled its copy and sent it back: ${firstFive(back)}, ...; this side's buffer is unchanged: ${firstFive(values)}, ... OK`);
    console.log(`producer: copied ${link.bytesCopied.sent} bytes out and ${link.bytesCopied.received} bytes in over TCP`);
    return 0;
  } finally {
    reply.buffer.close();
  }
}

async function produceDevice(link: Link<Ready | Reply, Handoff>, at: string, device: Device, n: number): Promise<number> {
  using array = DeviceArray.allocate('float32', [n], { device });
  const host = new Float32Array(n);
  fillPattern(host);
  array.write(host);
  console.log(`producer: consumer connected from ${at}; sending ${firstFive(host)}, ... from device ${device.ordinal} (${device.name}) over NCCL`);
  link.send({ array, elements: n });
  const reply = await link.receive<Reply>();
  if (!reply.ok) return consumerFailed(reply);
  if (!('array' in reply)) throw new IpcError('ERR_FRAME_INVALID', 'the consumer answered device memory with host memory');
  try {
    const back = reply.array.read() as Float32Array;
    const bad = back.length === n ? findMismatch(back, 2) : 0;
    if (bad >= 0) {
      console.error(`producer: element ${bad} of what came back is ${back[bad]}, expected ${patternValue(bad) * 2}`);
      return 1;
    }
    const mine = findMismatch(array.read() as Float32Array);
    if (mine >= 0) {
      console.error(`producer: element ${mine} of this side's array changed: the consumer must have received a copy of its own`);
      return 1;
    }
    const traffic = link.bytesMoved;
    console.log(`producer: the consumer doubled its copy on its GPU and sent it back: ${firstFive(back)}, ...; this side's array is unchanged. OK`);
    console.log(`producer: moved ${traffic.sent} bytes out and ${traffic.received} bytes in over NCCL`);
    return 0;
  } finally {
    reply.array.buffer.close();
  }
}

export async function consumeOverTcp(args: ParsedArgs, url: string): Promise<number> {
  const target = cliUrl(url, 'consume');
  const timeoutMs = secondsOption(args, 'timeout', 60);
  const dev = deviceChoice(args);
  const ordinal = dev.ordinal;
  checkDeviceOrdinal(ordinal, dev.explicit, 'take host memory instead', dev.option);
  const token = cliToken(args);
  console.log(`consumer ${process.pid}: connecting to ${target} (waiting up to ${timeoutMs / 1000} s for the producer: cuda-ipc produce --listen ...)`);
  const link = await connect<Handoff, Ready | Reply>(target, { timeout: timeoutMs, token }).catch((e: unknown) => {
    throw cliAuthError(e, `the listener at ${target}`);
  });
  try {
    let handoff: Handoff;
    try {
      const why = whyNoGpu(ordinal);
      if (why === undefined) setLinkWorkingDevice(link, Device.get(ordinal));
      link.send(why === undefined ? { device: true } : { device: false, why });
      handoff = await link.receive({ timeout: timeoutMs });
    } catch (e) {
      // E.g. ERR_NCCL receiving device memory: the producer prints the same cause.
      await tellPeer<Ready | Reply>(link, e, failedReply(e));
      throw e;
    }
    const failed = peerFailure(handoff);
    if (failed) throw failedPeerError(`the producer at ${target}`, failed);
    if ('failed' in handoff) throw new IpcError('ERR_FRAME_INVALID', `the producer at ${target} sent a failure this consumer cannot read`);
    const reply = 'array' in handoff ? await consumeDevice(handoff.array, handoff.elements) : consumeHost(handoff.buffer, handoff.elements);
    link.send(reply);
    if ('array' in handoff) handoff.array.buffer.close();
    else handoff.buffer.close();
    await link.end();
    if (!reply.ok) throw failedPeerError('', reply);
    return 0;
  } finally {
    link.close();
  }
}

function consumeHost(buffer: HostBuffer, elements: number): Reply {
  try {
    const values = floats(buffer);
    console.log(`consumer ${process.pid}: received a copy of ${values.length} float32 (${buffer.byteLength} bytes over TCP): ${firstFive(values)}, ...`);
    if (values.length !== elements) throw new Error(`the producer announced ${elements} elements and sent ${values.length}`);
    const bad = findMismatch(values);
    if (bad >= 0) throw new Error(`element ${bad} is ${values[bad]}, which is not the producer's pattern`);
    for (let i = 0; i < values.length; i++) values[i]! *= 2;
    console.log(`consumer: verified every element and doubled them in its copy: ${firstFive(values)}, ...; sending it back`);
    return { ok: true, buffer };
  } catch (e) {
    return failedReply(e);
  }
}

async function consumeDevice(array: DeviceArray<'float32'>, elements: number): Promise<Reply> {
  try {
    const values = array.read() as Float32Array;
    console.log(`consumer ${process.pid}: received ${values.length} float32 over NCCL into device ${array.buffer.device.ordinal}: ${firstFive(values)}, ...`);
    if (values.length !== elements) throw new Error(`the producer announced ${elements} elements and sent ${values.length}`);
    const bad = findMismatch(values);
    if (bad >= 0) throw new Error(`element ${bad} is ${values[bad]}, which is not the producer's pattern`);
    BuiltinKernels.for(array.buffer.device).scale(array.buffer, 'f32', 2);
    array.buffer.device.synchronize();
    console.log('consumer: verified every element and doubled them on this GPU; sending them back over NCCL');
    return { ok: true, array };
  } catch (e) {
    return failedReply(e);
  }
}
