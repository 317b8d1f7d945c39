// A DeviceBuffer or DeviceArray sent on a TCP link (PROTOCOL.md 8.2, 'nccl-buffer'): the record
// says how many bytes (and the array's dtype and shape), the bytes follow over the link's NCCL
// communicator for the buffer's device, one ncclSend / ncclRecv. The receiver allocates memory of
// its own on the link's working device and delivers the message once the bytes are there; it then
// ends the lease, and the sender's memory is free to change. On a Unix link the same values are
// shared instead ('pool-buffer', 'legacy-buffer': device-transfers.ts).
import { DeviceBuffer } from '../../cuda/buffer.js';
import { IpcError } from '../../errors.js';
import { DeviceArray } from '../../arrays/device-array.js';
import { countTraffic, type TrafficLink } from '../../observe/hooks.js';
import { DeferredValue } from '../messages/handlers.js';
import type { Link } from '../connection/link.js';
import { beginOutgoing, incomingComm, ncclEncoding, type LinkComm } from '../nccl/nccl-comms.js';
import { decodeNcclBuffer, encodeNcclBuffer, NCCL_BUFFER_KIND } from '../messages/nccl-records.js';
import { registerTransferHandler, type TransferHandler } from './transfer.js';

type DeviceValue = DeviceBuffer | DeviceArray;

/** Queues `bytes` at `pointer` to or from rank `peer` (or a broadcast from it) on `comm`'s stream; resolves once queued, with its completion. */
async function queueOne(comm: LinkComm, op: 'send' | 'recv' | 'broadcast', pointer: bigint, bytes: number, peer: number): Promise<{ done: Promise<void> }> {
  const c = await comm.communicator();
  const stream = comm.stream;
  if (op === 'send') await c.send(pointer, bytes, peer, { stream });
  else if (op === 'recv') await c.recv(pointer, bytes, peer, { stream });
  else await c.broadcast(pointer, bytes, peer, { stream });
  const done = stream.synchronize().then(() => {
    if (c.closed) throw comm.ended ?? new IpcError('ERR_NCCL', 'the NCCL transfer was cut short: its communicator was aborted');
  });
  return { done };
}

export const ncclBufferTransfer: TransferHandler<DeviceValue> = {
  kind: NCCL_BUFFER_KIND,
  transports: ['tcp'],
  canTransfer: (value): value is DeviceValue => value instanceof DeviceBuffer || value instanceof DeviceArray,
  encode(value, link) {
    const l = link as Link;
    const buffer = value instanceof DeviceArray ? value.buffer : value;
    if (value instanceof DeviceArray && !value.contiguous) {
      throw new IpcError('ERR_NOT_TRANSFERABLE', 'link.send: a strided DeviceArray cannot cross a TCP link (its bytes go as one NCCL transfer); send a C-contiguous copy');
    }
    if (buffer.closed) throw new IpcError('ERR_CLOSED', 'link.send: the DeviceBuffer is closed; send it before closing it');
    const pointer = buffer.devicePointer;
    const bytes = buffer.byteLength;
    const out = beginOutgoing(l, buffer.device);
    const array = value instanceof DeviceArray ? { dtype: value.dtype, shape: value.shape } : undefined;
    const data = encodeNcclBuffer({ comm: out.reference, sequence: out.sequence, byteLength: bytes, deviceUuid: buffer.device.uuidBytes, array });
    // The memory stays until the peer has it (its RELEASE) and NCCL is done reading it (the send
    // finished, or was aborted with the link), whichever is later.
    const comm = out.comm;
    return ncclEncoding(out, data, bytes, buffer.memory.lease(), async () => {
      const q = await queueOne(comm, comm.broadcast ? 'broadcast' : 'send', pointer, bytes, comm.broadcast ? 0 : 1);
      q.done.then(() => countTraffic(l as TrafficLink, 'ncclSent', bytes), () => {});
      return q;
    });
  },
  decode(data, fds, link, lease) {
    const l = link as Link;
    if (fds.length !== 0) throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received an nccl-buffer record with fds');
    const r = decodeNcclBuffer(data);
    const comm = incomingComm(l, r.comm, r.sequence);
    let buffer: DeviceBuffer;
    try {
      buffer = DeviceBuffer.allocate(r.byteLength, { device: comm.device });
    } catch (e) {
      const error = new IpcError('ERR_NCCL', `could not allocate ${r.byteLength} bytes on device ${comm.device.ordinal} to receive a buffer over NCCL: ${(e as Error).message}`, { cause: e });
      comm.abort(error, 1);
      throw error;
    }
    const value = r.array ? new DeviceArray(buffer, { dtype: r.array.dtype, shape: r.array.shape }) : buffer;
    const ready = new Promise<void>((resolve, reject) => {
      comm.submit(r.sequence, async () => {
        const q = await queueOne(comm, comm.broadcast ? 'broadcast' : 'recv', buffer.devicePointer, r.byteLength, 0);
        q.done.then(() => {
          countTraffic(l as TrafficLink, 'ncclReceived', r.byteLength);
          resolve();
        }, reject);
        return q;
      }, reject);
    });
    // The sender's memory is free once the bytes are here (or the transfer failed).
    void ready.then(() => lease?.end(), () => lease?.end());
    return new DeferredValue(value, ready);
  },
};

registerTransferHandler(ncclBufferTransfer);
