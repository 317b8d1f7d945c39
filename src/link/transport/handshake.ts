// The link handshake's rules: which peers a link accepts (its own uid, or one the opener allowed)
// and what a refusal says, to the user here and to the peer in its REFUSE frame. link.ts runs the
// exchange itself: HELLO both ways, then the link is open.
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { FrameType, HEADER_BYTES, RefuseReason, writeHeader } from './frame.js';

const myUid = process.getuid?.() ?? -1;

/** Whether a peer running as `uid` may have a link with this process. */
export function uidAllowed(uid: number, allowUids: readonly number[]): boolean {
  return uid === myUid || allowUids.includes(uid);
}

/**
 * Refusing the peer `peer` (named `peerName` in messages) for its uid: the error this side closes
 * with, and the REFUSE payload that tells the peer why (u16 reason, then UTF-8 text).
 */
export function uidRefusal(peer: { pid: number; uid: number }, peerName: string): { error: IpcError; payload: Uint8Array } {
  const error = new IpcError(
    'ERR_PEER_REFUSED',
    `refused a link with the ${peerName} (pid ${peer.pid}): it runs as uid ${peer.uid}, this process as uid ${myUid}; ` +
      `pass { allowUids: [${peer.uid}] } to accept links from that user`,
  );
  const text = Buffer.from(`uid ${peer.uid} is not allowed by the process at the other end (pid ${process.pid}, uid ${myUid})`);
  const payload = new Uint8Array(2 + text.byteLength);
  new DataView(payload.buffer).setUint16(0, RefuseReason.Uid, true);
  payload.set(text, 2);
  return { error, payload };
}

/**
 * Refuses a connection a listener has no room for: a REFUSE (reason 4, busy) straight into the new
 * socket `fd`, then closes it. The peer's connect() then says why (ERR_LISTENER_BUSY) instead of
 * finding the link gone.
 */
export function refuseBusy(fd: number, text: string): void {
  const body = Buffer.from(text.slice(0, 1000));
  const frame = new Uint8Array(HEADER_BYTES + 2 + body.byteLength);
  const view = new DataView(frame.buffer);
  writeHeader(view, FrameType.Refuse, 0, 2 + body.byteLength, 0);
  view.setUint16(HEADER_BYTES, RefuseReason.Busy, true);
  frame.set(body, HEADER_BYTES + 2);
  let sock;
  try {
    sock = new addon.Socket(fd, 64, () => {}, () => {});
  } catch {
    addon.close(fd);
    return;
  }
  try {
    sock.send(frame, frame.byteLength, null, null); // a new socket has room for one small record
  } catch {
    // The peer is gone already.
  } finally {
    sock.close();
  }
}
