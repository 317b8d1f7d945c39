// The link handshake's rules: which peers a link accepts (its own uid, or one the opener allowed)
// and what a refusal says, to the user here and to the peer in its REFUSE frame. link.ts runs the
// exchange itself: HELLO both ways, then the link is open.
import { IpcError } from '../errors.js';
import { RefuseReason } from './frame.js';

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
