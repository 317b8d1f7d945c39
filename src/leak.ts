// Backstop for resources that are garbage-collected without close(): warn once, naming where the
// resource was created, then release it so the process does not keep leaking.
interface Tracked { what: string; site: { stack?: string }; release: () => void }

const registry = new FinalizationRegistry<Tracked>((t) => {
  const where = (t.site.stack ?? '').split('\n').slice(1).join('\n');
  process.emitWarning(`a ${t.what} was garbage-collected without close(); it was created at:\n${where}`,
    { code: 'CUDA_IPC_LEAK' });
  try {
    t.release();
  } catch {
    // The process may be tearing down the context; a failed late release is not actionable.
  }
});

/**
 * Registers `owner` so that `release` runs (with a warning) if it is collected while open.
 * The stack is captured now but only formatted if a warning is printed.
 */
export function trackLeak(owner: object, what: string, release: () => void): void {
  const site: { stack?: string } = {};
  // A few frames name the caller; a full stack walk costs microseconds on every allocation.
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 6;
  Error.captureStackTrace(site, trackLeak);
  Error.stackTraceLimit = limit;
  registry.register(owner, { what, site, release }, owner);
}

export function untrackLeak(owner: object): void {
  registry.unregister(owner);
}
