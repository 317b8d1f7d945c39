// Closing file descriptors that arrived with (or were queued for) a frame, quietly: by the time
// they are closed here, one that is gone already has nothing left to release.
import { addon } from '../../native/addon.js';

export function closeFd(fd: number): void {
  try {
    addon.close(fd);
  } catch {
    // Already closed by someone else: nothing left to release.
  }
}

/** Closes every fd of `fds` but the entries set to -1 (handed over to a decoded value). */
export function closeFds(fds: readonly number[] | null | undefined): void {
  if (!fds) return;
  for (const fd of fds) if (fd >= 0) closeFd(fd);
}
