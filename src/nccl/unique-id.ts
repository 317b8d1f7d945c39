// The id every rank of one communicator is created with: 128 opaque bytes (ncclUniqueId, passed
// to NCCL by value), made by one rank and sent to the others, e.g. in a link message.
import { invalidArgType, invalidArgValue, received } from '../arg-errors.js';

/** Bytes in an ncclUniqueId. */
export const NCCL_UNIQUE_ID_BYTES = 128;

declare const uniqueIdBrand: unique symbol;

/**
 * An NCCL unique id: 128 bytes, from `library.uniqueId()` / `ncclUniqueId()` on one rank, or
 * `asNcclUniqueId(bytes)` of the bytes another rank sent.
 */
export type NcclUniqueId = Uint8Array & { readonly [uniqueIdBrand]: true };

/** `bytes` (128 of them, e.g. received in a link message) as an NcclUniqueId; throws TypeError otherwise. */
export function asNcclUniqueId(bytes: Uint8Array): NcclUniqueId {
  if (!(bytes instanceof Uint8Array)) throw invalidArgType(`An NCCL unique id must be a Uint8Array. ${received(bytes)}`);
  if (bytes.byteLength !== NCCL_UNIQUE_ID_BYTES) {
    throw invalidArgValue(`An NCCL unique id is ${NCCL_UNIQUE_ID_BYTES} bytes; got ${bytes.byteLength}`);
  }
  return bytes as NcclUniqueId;
}
