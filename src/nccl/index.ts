// Public surface of the NCCL layer: device bytes between processes and machines over NCCL,
// with libnccl.so.2 found at run time (never a build dependency).
export { loadNccl, formatNcclVersion, NcclLibrary, type LoadNcclOptions } from './library.js';
export { NcclCommunicator, type NcclInitOptions, type NcclCallOptions, type NcclOperation, type NcclBuffer } from './communicator.js';
export { NcclError, NcclUnavailableError, NcclResult, ncclResultName, type NcclResultName, type NcclAttempt } from './errors.js';
export { asNcclUniqueId, NCCL_UNIQUE_ID_BYTES, type NcclUniqueId } from './unique-id.js';
export { NCCL_LIBRARY_ENV, type NcclSource } from './discovery.js';
import { loadNccl, type LoadNcclOptions } from './library.js';
import type { NcclUniqueId } from './unique-id.js';

/** A new NCCL unique id from the library loadNccl(options) finds: `(await loadNccl(options)).uniqueId()`. */
export async function ncclUniqueId(options?: LoadNcclOptions): Promise<NcclUniqueId> {
  return (await loadNccl(options)).uniqueId();
}
