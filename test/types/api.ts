// Type-level tests of the public API, compiled (never run) by test/cpu/types.test.ts and by the
// package test against the packed tarball, with a new user's strict tsconfig. Each line after an
// expect-error directive must be an error: if a signature loosens, the directive is unused and
// the compile fails.
import {
  HostBuffer, DeviceBuffer, Device, Link, Listener, IpcError, ChannelHub, ChannelProducer, ChannelConsumer, ChannelMessage,
  spawn, parentLink, connect, listen, createChannel, acceptChannel, pipelineStage, setLinkWorkingDevice,
  type SlotBuffer, type LinkEvents, type TcpListener, type RemoteEndpoint, type LinkTransportKind, type LinkUrl, type RefusedReport,
  NcclCommunicator, loadNccl, asNcclUniqueId, type NcclUniqueId, type NcclResultName,
} from 'cuda-ipc';

/** Compiles only when A and B are the same type. */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(): T | void {}

interface Job { buffer: HostBuffer; id: number }
interface Done { id: number; sum: number }

export async function links(link: Link): Promise<void> {
  // receive() is unknown unless told; receive<T>() types one message.
  const any = await link.receive();
  assertType<Equal<typeof any, unknown>>();
  const job = await link.receive<Job>();
  assertType<Equal<typeof job, Job>>();
  job.buffer.bytes.fill(job.id);

  // A typed link: what arrives (In) and what may be sent (Out).
  const { link: child } = await spawn<Done, Job>(new URL('./child.js', import.meta.url));
  child.send({ buffer: HostBuffer.allocate(8), id: 1 });
  // @ts-expect-error the link sends Jobs
  child.send({ id: 1, sum: 2 });
  const done = await child.receive();
  assertType<Equal<typeof done, Done>>();
  for await (const m of child) assertType<Equal<typeof m, Done>>();
  child.on('message', (m) => assertType<Equal<typeof m, Done>>());

  // A typed link goes wherever a Link does (channels, per-link settings).
  await createChannel(child, { role: 'producer', slots: 2, slotBytes: 64 });
  setLinkWorkingDevice(child, undefined);

  const up = parentLink<Job, Done>();
  up.send({ id: 1, sum: 2 });
  const fromParent = await up.receive();
  assertType<Equal<typeof fromParent, Job>>();
  const byName = await connect<Done, Job>('service');
  assertType<Equal<Awaited<ReturnType<typeof byName.receive>>, Done>>();

  // Events: typed listeners, and no catch-all for a misspelt name.
  link.on('close', (reason) => assertType<Equal<typeof reason, IpcError | undefined>>());
  link.once('messageerror', (e) => assertType<Equal<typeof e, IpcError>>());
  // @ts-expect-error 'mesage' is not an event of a Link
  link.on('mesage', () => {});
  // @ts-expect-error a close listener gets an IpcError or undefined, not a string
  link.on('close', (reason: string) => reason);
  // @ts-expect-error off() is typed the same way
  link.off('closed', () => {});
  assertType<Equal<LinkEvents<Done>['message'], [value: Done]>>();

  const server: Listener = listen('service');
  server.on('connection', (l) => assertType<Equal<typeof l, Link>>());
  // @ts-expect-error 'connect' is not an event of a Listener
  server.on('connect', () => {});
  server.close();

  // Across machines: a tcp:// or tls:// URL listens asynchronously (a TcpListener) and takes a token.
  const tcp = await listen('tcp://127.0.0.1:0', { token: 'at-least-sixteen-bytes' });
  assertType<Equal<typeof tcp, TcpListener>>();
  assertType<Equal<typeof tcp.url, LinkUrl>>();
  tcp.on('refused', (e) => assertType<Equal<typeof e, IpcError>>());
  // Refusals are coalesced: the first error, and a report counting them all by code and source.
  tcp.on('refused', (_e, report) => {
    assertType<Equal<typeof report, RefusedReport>>();
    assertType<Equal<typeof report.count, number>>();
    assertType<Equal<typeof report.bySource, Record<string, number>>>();
  });
  const remote = await connect<Done, Job>(tcp.url, { token: new Uint8Array(16), timeout: 1000 });
  assertType<Equal<Awaited<ReturnType<typeof remote.receive>>, Done>>();
  assertType<Equal<typeof remote.remote, RemoteEndpoint | undefined>>();
  assertType<Equal<typeof remote.transport, LinkTransportKind>>();
  // @ts-expect-error a token is a string or bytes
  await listen('tcp://127.0.0.1:0', { token: 42 });
  // @ts-expect-error a TcpListener is not a Unix Listener (no socket path)
  tcp.path;
  tcp.close();
}

export async function channels(link: Link, device: Device): Promise<void> {
  // memory narrows the slot type; Meta types the metadata.
  const host = await createChannel<{ seq: number }>(link, { role: 'producer', slots: 4, slotBytes: 4096 });
  assertType<Equal<typeof host, ChannelProducer<HostBuffer, { seq: number }>>>();
  const slot = await host.acquire();
  assertType<Equal<typeof slot.buffer, HostBuffer>>();
  host.publish(slot, { meta: { seq: 1 } });
  // @ts-expect-error meta must be a { seq: number }
  host.publish(slot, { meta: { seq: 'one' } });
  // @ts-expect-error this channel's messages carry a meta, so publish needs one
  host.publish(slot);
  // @ts-expect-error even one that only sets the length
  host.publish(slot, { length: 8 });
  slot.dataView.setUint32(0, 7, true);  // numbers into the slot, no DataView of one's own

  // Meta that only some messages carry: say so in the type, and publish may leave it out.
  const sometimes = await createChannel<{ seq: number } | undefined>(link, { role: 'producer', slots: 4, slotBytes: 4096 });
  sometimes.publish(await sometimes.acquire(), { length: 8 });
  sometimes.publish(await sometimes.acquire(), { meta: { seq: 2 } });

  const untyped = await createChannel(link, { role: 'producer', slots: 4, slotBytes: 4096, memory: 'host' });
  untyped.publish(await untyped.acquire());  // Meta unknown: meta is optional

  const onDevice = await createChannel(link, { role: 'producer', slots: 4, slotBytes: 1 << 20, memory: { device } });
  assertType<Equal<typeof onDevice, ChannelProducer<DeviceBuffer, unknown>>>();

  const fromHost = await acceptChannel<{ seq: number }>(link, { role: 'consumer', memory: 'host' });
  assertType<Equal<typeof fromHost, ChannelConsumer<HostBuffer, { seq: number }>>>();
  for await (const msg of fromHost) {
    assertType<Equal<typeof msg, ChannelMessage<HostBuffer, { seq: number }>>>();
    assertType<Equal<typeof msg.meta.seq, number>>();
    msg.release();
  }
  const fromDevice = await acceptChannel(link, { role: 'consumer', memory: 'device' });
  assertType<Equal<typeof fromDevice, ChannelConsumer<DeviceBuffer, unknown>>>();
  const either = await acceptChannel(link, { role: 'producer' });
  assertType<Equal<typeof either, ChannelProducer<SlotBuffer, unknown>>>();
  // @ts-expect-error memory is 'host' or 'device'
  await acceptChannel(link, { role: 'consumer', memory: 'gpu' });
  // @ts-expect-error a consumer end cannot publish
  fromHost.publish;

  const hub = ChannelHub.create<{ n: number }>({ slots: 2, slotBytes: 64 });
  assertType<Equal<typeof hub, ChannelHub<HostBuffer, { n: number }>>>();
  const received = await hub.consumer().receive();
  if (received) assertType<Equal<typeof received.meta, { n: number }>>();
  const deviceHub = ChannelHub.create({ slots: 2, slotBytes: 256, memory: { device } });
  assertType<Equal<typeof deviceHub, ChannelHub<DeviceBuffer, unknown>>>();

  const stage = await pipelineStage<{ frame: number }>();
  const next = await stage.input?.receive();
  if (next) assertType<Equal<typeof next.meta, { frame: number }>>();
}

// Resources are disposable (the declarations carry Disposable without the user's lib naming it).
export function disposal(): number {
  using buffer = HostBuffer.allocate(16);
  return buffer.byteLength;
}

export async function nccl(link: Link<{ id: Uint8Array }>, device: Device, buffer: DeviceBuffer): Promise<void> {
  const library = await loadNccl();
  const id = library.uniqueId();
  assertType<Equal<typeof id, NcclUniqueId>>();
  const { id: received } = await link.receive();
  // @ts-expect-error received bytes become an id through asNcclUniqueId, which checks their length
  await NcclCommunicator.init({ uniqueId: received, nranks: 2, rank: 1, device });
  await using comm = await NcclCommunicator.init({ uniqueId: asNcclUniqueId(received), nranks: 2, rank: 1, device, timeout: 1000 });
  await comm.send(buffer, buffer.byteLength, 0);
  await comm.recv(buffer.devicePointer, 16n, 0);
  await comm.group([{ op: 'send', buffer, bytes: 8, peer: 0 }, { op: 'broadcast', buffer, bytes: 8, root: 0 }]);
  // @ts-expect-error a broadcast has a root, not a peer
  await comm.group([{ op: 'broadcast', buffer, bytes: 8, peer: 0 }]);
  const state = comm.asyncError();
  assertType<Equal<typeof state, NcclResultName>>();
}
