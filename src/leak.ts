// Backstop for resources that are garbage-collected without close(): warn once per place of
// creation (a loop that leaks warns once, naming the line), then release the resource so the
// process does not keep leaking.
import { fileURLToPath } from 'node:url';

interface Tracked { what: string; where: string; release: () => void }

const warnedSites = new Set<string>();

const registry = new FinalizationRegistry<Tracked>((t) => {
  if (!warnedSites.has(t.where)) {
    warnedSites.add(t.where);
    process.emitWarning(`${t.what} was garbage-collected without close(); close it, or declare it with \`using\`. Created ${t.where}`,
      { code: 'CUDA_IPC_LEAK' });
  }
  try {
    t.release();
  } catch {
    // The process may be tearing down the context; a failed late release is not actionable.
  }
});

/**
 * Where the caller's caller is, as text. Formatted now: an unformatted V8 stack keeps every
 * frame's `this` alive, which would keep the tracked object itself from ever being collected.
 */
function creationSite(): string {
  const site: { stack?: string } = {};
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 10; // enough to get past this package's own frames; a full walk costs more
  Error.captureStackTrace(site, trackLeak);
  Error.stackTraceLimit = limit;
  const frames = (site.stack ?? '').split('\n').slice(1);
  const user = frames.filter((f) => !f.includes(packageSource));
  return 'at:\n' + (user.length ? user : frames).slice(0, 4).join('\n');
}

// Frames in this package's own code say nothing about where the user created the resource.
const packageSource = fileURLToPath(new URL('.', import.meta.url));

/**
 * Registers `owner` so that `release` runs (with a warning) if it is collected while open.
 * `where` describes its origin when a stack would not help (e.g. 'from a link message');
 * otherwise the creating call is recorded.
 */
export function trackLeak(owner: object, what: string, release: () => void, where?: string): void {
  registry.register(owner, { what, where: where ?? creationSite(), release }, owner);
}

export function untrackLeak(owner: object): void {
  registry.unregister(owner);
}
