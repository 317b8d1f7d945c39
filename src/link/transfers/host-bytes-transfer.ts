// A HostBuffer sent on a TCP link (PROTOCOL.md 4.1, 'host-bytes'): no fd can cross machines, so
// its bytes are copied into the message at send() and the receiver makes a new HostBuffer (a
// memfd, as HostBuffer.allocate) holding them. Nothing is leased: the sender's buffer is free to
// change or close at once, and the two copies never see each other's writes. The bytes count in
// the link's and the process's bytesCopied (countTraffic, observe/hooks.ts). On a Unix-socket link a
// HostBuffer is shared instead ('host-buffer', host-transfer.ts).
//
//   data = u64 length n (1..2^53-1) | n bytes
import { IpcError } from '../../errors.js';
import { HostBuffer } from '../../host/host-buffer.js';
import { countTraffic, type TrafficLink } from '../../observe/hooks.js';
import { readU64, writeU64 } from '../transport/frame.js';
import { registerTransferHandler, type TransferHandler } from './transfer.js';

const LENGTH_BYTES = 8;

export const hostBytesTransfer: TransferHandler<HostBuffer> = {
  kind: 'host-bytes',
  transports: ['tcp'],
  canTransfer: (value): value is HostBuffer => value instanceof HostBuffer,
  encode(buffer, link) {
    if (buffer.closed) throw new IpcError('ERR_CLOSED', 'link.send: the HostBuffer is closed; send it before closing it');
    const n = buffer.byteLength;
    if (n === 0) throw new IpcError('ERR_NOT_TRANSFERABLE', 'link.send: an empty HostBuffer view cannot cross a TCP link (a host-bytes record holds 1 byte or more); send an empty Uint8Array instead');
    const data = Buffer.allocUnsafeSlow(LENGTH_BYTES + n); // every byte is written below
    writeU64(new DataView(data.buffer, data.byteOffset, LENGTH_BYTES), 0, n);
    buffer.read(data.subarray(LENGTH_BYTES));
    return { data, onCommit: () => countTraffic(link as TrafficLink, 'copiedSent', n) };
  },
  decode(data, fds, link, lease) {
    const n = data.byteLength >= LENGTH_BYTES ? readU64(new DataView(data.buffer, data.byteOffset, data.byteLength), 0) : -1;
    if (n <= 0 || data.byteLength !== LENGTH_BYTES + n) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a malformed host-bytes record: ${data.byteLength} bytes of data announcing ${n < 0 ? 'a length past 2^53' : n} bytes`);
    }
    if (fds.length !== 0 || lease !== undefined) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received a host-bytes record with fds or a lease; a copy carries neither');
    }
    const copy = HostBuffer.allocate(n);
    try {
      copy.write(data.subarray(LENGTH_BYTES));
    } catch (e) {
      copy.close();
      throw e;
    }
    countTraffic(link as TrafficLink, 'copiedReceived', n);
    return copy;
  },
};

registerTransferHandler(hostBytesTransfer);
