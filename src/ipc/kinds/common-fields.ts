// Fields several descriptor kinds share.

import { checkIntInRange, type Field } from '../checks.js';

/** CUipcMemHandle, CUipcEventHandle and pool export data are all 64 opaque bytes. */
export const HANDLE_BYTES = 64;

/** pid_t is a signed 32-bit integer and real pids are positive. */
export const MAX_PID = 0x7fffffff;

export function checkPid(value: unknown, field: Field): number {
  return checkIntInRange(value, 1, MAX_PID, field, ' (the exporting process id)');
}
