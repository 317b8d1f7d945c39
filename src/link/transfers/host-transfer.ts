// Sending a HostBuffer over a link passes its memfd (borrowed for the send) and where the buffer
// lies in it; the receiver maps the same memory. Data: u64 file length, u64 offset, u64 length.
// The send leases the sender's mapping to the peer: it stays mapped until the receiver's last
// view of what it got is closed (the lease ends), or the link closes.
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { readU64, writeU64 } from '../transport/frame.js';
import { registerTransferHandler, type TransferHandler } from './transfer.js';
import { HostBuffer, describeHostBuffer, leaseHostBuffer, whenHostBufferReleased } from '../../host/host-buffer.js';

const DATA_BYTES = 24;
// encode()'s data is copied into the frame before the next encode, so one scratch serves all.
const scratch = new Uint8Array(DATA_BYTES);
const scratchView = new DataView(scratch.buffer);

export const hostBufferTransfer: TransferHandler<HostBuffer> = {
  kind: 'host-buffer',
  // Its memfd cannot cross machines: on a TCP link a HostBuffer travels as 'host-bytes' (host-bytes-transfer.ts).
  transports: ['unix'],
  canTransfer: (value): value is HostBuffer => value instanceof HostBuffer,
  encode(buffer) {
    if (buffer.closed) throw new IpcError('ERR_CLOSED', 'link.send: the HostBuffer is closed; send it before closing it');
    const { mappingLength, sealed, mapping } = describeHostBuffer(buffer);
    if (!sealed) {
      throw new IpcError(
        'ERR_NOT_TRANSFERABLE',
        'link.send: this HostBuffer\'s file is not sealed against shrinking, so a receiver could crash (SIGBUS) if it ' +
          'were truncated; send buffers made by HostBuffer.allocate()',
      );
    }
    writeU64(scratchView, 0, mappingLength);
    writeU64(scratchView, 8, buffer.byteOffset);
    writeU64(scratchView, 16, buffer.byteLength);
    return { data: scratch, fds: [buffer.fd], hold: { release: leaseHostBuffer(buffer), bytes: buffer.byteLength, fd: mapping } };
  },
  decode(data, fds, _link, lease) {
    if (data.byteLength !== DATA_BYTES || fds.length !== 1) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a malformed host-buffer (${data.byteLength} bytes, ${fds.length} fds)`);
    }
    const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
    const fileLength = readU64(v, 0);
    const offset = readU64(v, 8);
    const length = readU64(v, 16);
    const fd = fds[0]!;
    if (fileLength <= 0 || offset < 0 || length <= 0 || offset + length > fileLength) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a host-buffer whose range (${offset}+${length}) lies outside its ${fileLength}-byte file`);
    }
    // Only a memfd (a regular file) is mapped: a pipe, socket, directory or device is refused
    // before anything touches it, and so is a file shorter than announced (SIGBUS otherwise).
    const kind = addon.fileKind(fd);
    if (kind !== 'file') throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a host-buffer whose fd is a ${kind}, not a memfd`);
    const size = addon.fstatSize(fd);
    if (size < fileLength) throw new IpcError('ERR_DESCRIPTOR_INVALID', `received a host-buffer announcing a ${fileLength}-byte file whose fd holds ${size} bytes`);
    let seals = 0;
    try {
      seals = addon.getSeals(fd);
    } catch {
      // Not a memfd: no seals.
    }
    if ((seals & addon.posixConstants.F_SEAL_SHRINK) === 0) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received a host-buffer whose file is not sealed against shrinking; mapping it could crash this process');
    }
    if ((seals & addon.posixConstants.F_SEAL_WRITE) !== 0) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received a host-buffer whose file is sealed against writing; a host buffer is memory both sides may write');
    }
    const whole = HostBuffer.fromFd(fd, fileLength);
    fds[0] = -1;  // owned by `whole` now, even if a check or view() below throws
    if (!describeHostBuffer(whole).sealed) {
      // Unmapped before anyone touched it: only a truncation under a touched mapping is fatal.
      whole.close();
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received a host-buffer whose file is not sealed against shrinking; mapping it could crash this process');
    }
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
