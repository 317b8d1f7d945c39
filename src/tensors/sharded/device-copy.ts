// Placeholder until the device data path lands (issue 37, s2): the device RunCopier (copy_runs
// launches). The group imports it by this name; the real module replaces this file.
import { IpcError } from '../../errors.js';
import type { Device } from '../../cuda/device.js';
import type { RunCopier } from './execute-types.js';

/** The device copier on `device`: not in this build yet (throws ERR_NOT_IMPLEMENTED). */
export function deviceRunCopier(device: Device): RunCopier {
  throw new IpcError('ERR_NOT_IMPLEMENTED', `the device copier of sharded syncs (device ${device.ordinal}) is not in this build; use host memory, or pass ShardGroup options.executors`);
}
