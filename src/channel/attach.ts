// The attach protocol: how the hub hands a channel to the process at the other end of a link.
// Three link messages, all objects with the key '@cuda-ipc/channel' naming the step:
//
//   hub  -> peer  { '@cuda-ipc/channel': 'attach', version: 4, index, role, control, slots, doorbells }
//                   index: the participant entry the hub reserved (state 4, its role written);
//                   control: the control block (HostBuffer); slots: HostBuffer or DeviceBuffer
//                   (slotCount x slotBytes); doorbells: every participant entry's eventfd.
//   peer -> hub   { '@cuda-ipc/channel': 'ready', index }     (or 'refused', message)
//   hub  -> peer  { '@cuda-ipc/channel': 'active', index }    once the entry is alive
//
// The peer checks everything it received before using it (layout, entry, sizes, fd types) and
// refuses what does not fit; the hub marks the entry alive between 'ready' and 'active', so that
// the peer's end starts as a member. After that the link carries nothing for the channel: its
// closing is how each side learns the other is gone.
import { IpcError } from '../errors.js';
import type { Link } from '../link/index.js';
import { HostBuffer } from '../host/index.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import { IpcPool } from '../ipc/pool.js';
import { P, PState, PRole, readHeader } from './layout.js';
import { Block } from './block.js';
import { Doorbells } from './doorbells.js';
import { delay, type ChannelRole } from './options.js';

export const PROTOCOL = '@cuda-ipc/channel';
export const ATTACH_VERSION = 4;
const RETRY_MS = 2;

/** What a hub tells a peer it attaches. */
interface AttachMessage {
  [PROTOCOL]: 'attach';
  version: number;
  index: number;
  role: ChannelRole;
  control: HostBuffer;
  slots: HostBuffer | DeviceBuffer;
  doorbells: Doorbells;
}

export const roleNumber = (r: ChannelRole): number => (r === 'producer' ? PRole.Producer : PRole.Consumer);

function isProtocol(m: unknown, op: string): boolean {
  return typeof m === 'object' && m !== null && (m as Record<string, unknown>)[PROTOCOL] === op;
}

/** Closes the resources inside a message nobody will use. */
function disposeQuietly(values: unknown): void {
  const visit = (v: unknown, depth: number): void => {
    if (depth > 4 || v === null || typeof v !== 'object') return;
    if (v instanceof HostBuffer || v instanceof DeviceBuffer || v instanceof IpcPool || v instanceof Doorbells) {
      try { v.close(); } catch { /* already gone */ }
      return;
    }
    if (Array.isArray(v)) for (const x of v) visit(x, depth + 1);
    else for (const x of Object.values(v)) visit(x, depth + 1);
  };
  visit(values, 0);
}

/**
 * The hub's side, for entry k reserved for `role`: sends the channel, waits for the peer's
 * answer, then makes the entry alive (`activate()`: false while the publish lock is busy) and
 * confirms. Throws if the peer refused, went away, or answered something else.
 */
export async function offer(
  link: Link, block: Block, k: number, role: ChannelRole, activate: () => boolean, isOpen: () => boolean, signal: AbortSignal | undefined,
): Promise<void> {
  // `signal`: the caller's waitScope signal (one deadline for the whole handshake).
  const message: AttachMessage = {
    [PROTOCOL]: 'attach', version: ATTACH_VERSION, index: k, role, control: block.control, slots: block.slots, doorbells: block.bells,
  };
  link.send(message);
  const reply = await link.receive({ signal });
  if (isProtocol(reply, 'refused')) {
    throw new IpcError('ERR_PEER_REFUSED', `the peer refused the channel: ${String((reply as { message?: unknown }).message)}`);
  }
  if (!isProtocol(reply, 'ready') || (reply as { index?: unknown }).index !== k) {
    disposeQuietly(reply);
    throw new IpcError('ERR_FRAME_INVALID', 'attach: the peer answered with something other than the channel handshake; do not send other messages on a link while attach/acceptChannel run');
  }
  for (;;) {
    if (!isOpen()) throw new IpcError('ERR_CHANNEL_CLOSED', 'attach: the channel is closed');
    if (link.closed) throw new IpcError('ERR_PEER_GONE', 'attach: the peer went away during the handshake');
    if (activate()) break;
    await delay(RETRY_MS);  // a publish holds the lock (broadcast): microseconds
  }
  link.send({ [PROTOCOL]: 'active', index: k });
}

export interface Accepted {
  block: Block;
  index: number;
  role: ChannelRole;
}

/**
 * The peer's side: receives the channel over `link`, checks it, answers, and waits until the hub
 * made it a member. `role` / `memory`: refuse a channel that is not what this process expects.
 */
export async function accept(link: Link, want: { role?: ChannelRole; memory?: 'host' | 'device'; signal?: AbortSignal | undefined }): Promise<Accepted> {
  const msg = await link.receive({ signal: want.signal });
  if (!isProtocol(msg, 'attach')) {
    disposeQuietly(msg);
    throw new IpcError('ERR_FRAME_INVALID', 'acceptChannel: the first message on the link was not a channel (the other side must call attach or createChannel)');
  }
  const m = msg as AttachMessage;
  let owned = true;
  const refuse = (error: IpcError): never => {
    try { link.send({ [PROTOCOL]: 'refused', message: error.message }); } catch { /* the link is gone */ }
    throw error;
  };
  const bad = (what: string) => new IpcError('ERR_DESCRIPTOR_INVALID', `acceptChannel: ${what}`);
  try {
    if (m.version !== ATTACH_VERSION) {
      refuse(new IpcError('ERR_DESCRIPTOR_VERSION', `acceptChannel: channel protocol version ${String(m.version)}; this side speaks ${ATTACH_VERSION}: use the same cuda-ipc version on both sides`));
    }
    if (!(m.control instanceof HostBuffer)) refuse(bad('the control block is not shared memory'));
    const control = m.control;
    const view = new DataView(control.bytes.buffer, control.bytes.byteOffset, control.bytes.byteLength);
    let layout: ReturnType<typeof readHeader>;
    try {
      layout = readHeader(view, control.byteLength);
    } catch (e) {
      return refuse(e as IpcError);
    }
    const role = m.role;
    const k = m.index;
    if ((role !== 'producer' && role !== 'consumer') || !Number.isInteger(k) || k < 1 || k >= layout.maxParticipants) {
      refuse(bad(`bad role or index (${String(role)}, ${String(k)})`));
    }
    if (want.role !== undefined && want.role !== role) {
      refuse(new IpcError('ERR_DESCRIPTOR_KIND', `acceptChannel: the hub attached this process as a ${role}, not a ${want.role} as asked`));
    }
    if (want.memory !== undefined && want.memory !== (layout.device ? 'device' : 'host')) {
      refuse(new IpcError('ERR_DESCRIPTOR_KIND', `acceptChannel: the channel's slots are ${layout.device ? 'device' : 'host'} memory, not ${want.memory} as asked`));
    }
    if (layout.device ? !(m.slots instanceof DeviceBuffer) : !(m.slots instanceof HostBuffer)) refuse(bad(`${layout.device ? 'device' : 'host'} slots expected`));
    const total = layout.slotCount * layout.slotBytes;
    if (m.slots.byteLength < total) refuse(bad(`the slots hold ${m.slots.byteLength} bytes, fewer than ${layout.slotCount} x ${layout.slotBytes}`));
    if (!(m.doorbells instanceof Doorbells) || m.doorbells.count !== layout.maxParticipants) refuse(bad(`expected ${layout.maxParticipants} doorbells`));
    const po = layout.participantsOffset + k * 64;
    if (view.getUint32(po + P.state, true) !== PState.Recovering || view.getUint32(po + P.role, true) !== roleNumber(role)) {
      refuse(bad('the participant entry the hub named is not waiting for this peer'));
    }
    owned = false;
    const block = new Block({
      layout, control, bells: m.doorbells,
      slotsHost: layout.device ? undefined : (m.slots as HostBuffer),
      slotsDevice: layout.device ? (m.slots as DeviceBuffer) : undefined,
    });
    try {
      link.send({ [PROTOCOL]: 'ready', index: k });
      const active = await link.receive({ signal: want.signal });
      if (!isProtocol(active, 'active')) {
        disposeQuietly(active);
        throw new IpcError('ERR_FRAME_INVALID', 'acceptChannel: the hub did not confirm the attach');
      }
    } catch (e) {
      block.release();
      throw e;
    }
    return { block, index: k, role };
  } catch (e) {
    if (owned) disposeQuietly(m);
    throw e;
  }
}
