// Backstop for resources that are garbage-collected without close(): warn, then release the
// resource so the process does not keep leaking.
//
// By default a warning names the kind and size of what leaked ("A DeviceBuffer (1048576 bytes)"),
// once per kind and size. Knowing where each resource was created needs a stack trace per
// allocation (microseconds each, more than a whole handoff's worth of work), so it is opt-in:
// CUDA_IPC_TRACE_LEAKS=1 in the environment, or traceLeaks(true); the warning then names the line,
// once per line.
//
// Registering with a FinalizationRegistry and unregistering at close() costs more than the rest of
// a buffer's bookkeeping, and most buffers live for microseconds (one handoff). So resources wait
// in a pending list, which is registered in one go (those still open) whenever 256 wait and after
// each garbage collection that clears finalization registries (in Node 20, the full ones); one
// closed before that never touches the registry. The pending list holds its resources, so a leak is
// still caught, one collection later than a resource registered at once would be. (No timer: its
// wake-ups cost more than they save where processes ping-pong on one core.)
import { fileURLToPath } from 'node:url';

/** Something whose drop() releases a leaked resource (e.g. a buffer's reference on its memory). */
export interface LeakReleaser { drop(): void }

/**
 * One tracked resource: what a warning needs (the description is formatted when a leak is
 * reported, not for every resource), and the resource itself until it is registered. Returned by
 * trackLeak(); the owner gives it back to untrackLeak() when it is closed. A plain object:
 * measured smaller on the heap than an instance of a class with the same fields.
 */
export interface LeakToken {
  /** The resource, until it is registered (the registry must not hold it) or closed. */
  owner: object | undefined;
  readonly what: string;
  /** Appended as ' (N bytes)' when not negative. */
  readonly bytes: number;
  readonly where: string | undefined;
  release: (() => void) | LeakReleaser | undefined;
  registered: boolean;
}

const env = process.env.CUDA_IPC_TRACE_LEAKS;
let tracing = env !== undefined && env !== '' && env !== '0' && env.toLowerCase() !== 'false';

const warned = new Set<string>();

function describeToken(t: LeakToken): string {
  return t.bytes >= 0 ? `${t.what} (${t.bytes} bytes)` : t.what;
}

const registry = new FinalizationRegistry<LeakToken>((t) => {
  const what = describeToken(t);
  const key = t.where ?? what;
  if (!warned.has(key)) {
    warned.add(key);
    const where = t.where !== undefined
      ? ` Created ${t.where}`
      : ' Set CUDA_IPC_TRACE_LEAKS=1 (or call traceLeaks(true)) to see where each one is created.';
    process.emitWarning(`${what} was garbage-collected without close(); close it, or declare it with \`using\`.${where}`,
      { code: 'CUDA_IPC_LEAK' });
  }
  try {
    const r = t.release;
    if (typeof r === 'function') r();
    else r?.drop();
  } catch {
    // The process may be tearing down the context; a failed late release is not actionable.
  }
});

// Tracked resources not registered yet, oldest first (closed ones have owner undefined).
let pending: LeakToken[] = [];
/** How many resources wait at most. */
const MAX_PENDING = 256;
// Told when a garbage collection happened: an object of its own, unreachable from the start, is
// collected by the next collection, whose cleanup task then registers the pending resources.
const afterCollection = new FinalizationRegistry<null>(() => {
  watching = false;
  registerPending();
});
let watching = false;

/** Registers every pending resource that is still open. */
function registerPending(): void {
  const batch = pending;
  pending = [];
  for (const t of batch) {
    const owner = t.owner;
    if (owner === undefined) continue;  // closed before it needed the registry
    t.owner = undefined;  // the registry holds the token: it must not keep the resource alive
    t.registered = true;
    registry.register(owner, t, t);
  }
}

/**
 * Records the creation stack of every resource created from now on (or stops), so that leak
 * warnings name the line that created the leaked resource. Costs a stack trace per resource;
 * the default is off unless CUDA_IPC_TRACE_LEAKS=1 is set.
 */
export function traceLeaks(enabled: boolean): void {
  tracing = enabled;
}

/** True while creation stacks are recorded (traceLeaks / CUDA_IPC_TRACE_LEAKS). */
export function tracingLeaks(): boolean {
  return tracing;
}

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
 * Tracks `owner` so that `release` runs (a function, or an object's drop()) with a warning if it
 * is collected while open. `what` names it ('A DeviceBuffer'), `bytes` its size when known;
 * `where` describes its origin when a stack would not help (e.g. 'from a link message');
 * otherwise, while tracing, the creating call is recorded. Give the token to untrackLeak() when
 * the owner is closed.
 */
export function trackLeak(owner: object, what: string, release: (() => void) | LeakReleaser, where?: string, bytes = -1): LeakToken {
  const t: LeakToken = { owner, what, bytes, where: where ?? (tracing ? creationSite() : undefined), release, registered: false };
  pending.push(t);
  if (pending.length >= MAX_PENDING) {
    registerPending();
  } else if (!watching) {
    watching = true;
    afterCollection.register({}, null);
  }
  return t;
}

/** The owner was closed: no warning for it, ever. */
export function untrackLeak(t: LeakToken): void {
  if (t.registered) {
    t.registered = false;
    registry.unregister(t);
  }
  t.owner = undefined;
  t.release = undefined;
}
