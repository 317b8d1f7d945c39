// Sending a HostBuffer over a link passes its memfd (borrowed for the send) and where the buffer
// lies in it; the receiver maps the same memory. Data: u64 file length, u64 offset, u64 length.
// The send leases the sender's mapping to the peer: it stays mapped until the receiver's last
// view of what it got is closed (the lease ends), or the link closes.
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import { registerTransferHandler, type TransferHandler } from './transfer.js';
import { HostBuffer, describeHostBuffer, leaseHostBuffer, whenHostBufferReleased } from '../host/host-buffer.js';

const DATA_BYTES = 24;
const { F_SEAL_SHRINK } = addon.posixConstants;

export const hostBufferTransfer: TransferHandler<HostBuffer> = {
  kind: 'host-buffer',
  canTransfer: (value): value is HostBuffer => value instanceof HostBuffer,
  encode(buffer) {
    if (buffer.closed) throw new IpcError('ERR_CLOSED', 'link.send: the HostBuffer is closed; send it before closing it');
    const { mappingLength, sealed } = describeHostBuffer(buffer);
    if (!sealed) {
      throw new IpcError(
        'ERR_NOT_TRANSFERABLE',
        'link.send: this HostBuffer\'s file is not sealed against shrinking, so a receiver could crash (SIGBUS) if it ' +
          'were truncated; send buffers made by HostBuffer.allocate()',
      );
    }
    const data = new Uint8Array(DATA_BYTES);
    const v = new DataView(data.buffer);
    v.setBigUint64(0, BigInt(mappingLength), true);
    v.setBigUint64(8, BigInt(buffer.byteOffset), true);
    v.setBigUint64(16, BigInt(buffer.byteLength), true);
    return { data, fds: [buffer.fd], hold: { release: leaseHostBuffer(buffer), bytes: buffer.byteLength } };
  },
  decode(data, fds, _link, lease) {
    if (data.byteLength !== DATA_BYTES || fds.length !== 1) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a malformed host-buffer (${data.byteLength} bytes, ${fds.length} fds)`);
    }
    const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
    const fileLength = Number(v.getBigUint64(0, true));
    const offset = Number(v.getBigUint64(8, true));
    const length = Number(v.getBigUint64(16, true));
    const fd = fds[0]!;
    if (length === 0 || offset + length > fileLength || !Number.isSafeInteger(fileLength)) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a host-buffer whose range (${offset}+${length}) lies outside its ${fileLength}-byte file`);
    }
    let seals = 0;
    try {
      seals = addon.getSeals(fd);
    } catch {
      // Not sealable: refused below.
    }
    if ((seals & F_SEAL_SHRINK) === 0) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received a host-buffer whose file is not sealed against shrinking; mapping it could crash this process');
    }
    const whole = HostBuffer.fromFd(fd, fileLength);  // checks the file really is that long
    fds[0] = -1;  // owned by `whole` now, even if view() below throws
    // The mapping (whole, or kept by the view) ends the lease when it is finally unmapped.
    if (lease) whenHostBufferReleased(whole, () => lease.end());
    if (offset === 0 && length === fileLength) return whole;
    try {
      return whole.view(offset, length);
    } finally {
      whole.close();  // the view keeps the mapping (and the fd) alive
    }
  },
};

registerTransferHandler(hostBufferTransfer);
