// Placeholder until the NCCL data path lands (issue 37, s2): the NcclRunMover (grouped send/recv
// rounds, staging). The group imports it by this name; the real module replaces this file.
import { IpcError } from '../../errors.js';
import type { Device } from '../../cuda/device.js';
import type { NcclRunMover } from './execute-types.js';

/** The NCCL mover on `device`: not in this build yet (throws ERR_NOT_IMPLEMENTED). */
export function ncclRunMover(device: Device): NcclRunMover {
  throw new IpcError('ERR_NOT_IMPLEMENTED', `the NCCL mover of sharded syncs (device ${device.ordinal}) is not in this build; pass ShardGroup options.executors`);
}
