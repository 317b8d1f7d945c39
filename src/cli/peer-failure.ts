// The two-terminal example over TCP: a side that fails after the link opened tells the other why
// before it closes (its error's code and message, in an ordinary message of the CLI's own
// conversation: no frame of its own), so both terminals print the same cause instead of one of
// them saying only "the peer closed the link". What arrives is the peer's text: checked, bounded,
// and printed escaped (main prints every error through terminalSafe).

/** What a failing side sends: `{ failed: { v: 1, code, message } }`. */
export interface Failed {
  failed: { v: 1; code?: string; message: string };
}

/** Longest message kept (characters); a longer one is cut and marked. */
export const MAX_FAILURE_CHARS = 1024;
/** A code as errors carry them: ERR_NCCL, CUDA_ERROR_INVALID_VALUE, ABORT_ERR. */
const CODE_RE = /^[A-Z][A-Z0-9_]{0,63}$/;

const bounded = (text: string): string => (text.length > MAX_FAILURE_CHARS ? `${text.slice(0, MAX_FAILURE_CHARS)}...` : text);

/** `e` as a Failed message: its code (when it has one of the usual form) and its message, bounded. */
export function failureOf(e: unknown): Failed {
  const code = (e as { code?: unknown } | null)?.code;
  const message = e instanceof Error ? e.message : String(e);
  return { failed: { v: 1, ...(typeof code === 'string' && CODE_RE.test(code) ? { code } : {}), message: bounded(message) } };
}

/** The peer's failure if `value` is one (version 1, fields checked), else undefined. */
export function peerFailure(value: unknown): { code?: string; message: string } | undefined {
  const f = (value as { failed?: unknown } | null)?.failed as { v?: unknown; code?: unknown; message?: unknown } | undefined;
  if (typeof f !== 'object' || f === null || f.v !== 1 || typeof f.message !== 'string') return undefined;
  const code = typeof f.code === 'string' && CODE_RE.test(f.code) ? f.code : undefined;
  return { ...(code ? { code } : {}), message: bounded(f.message) };
}

/**
 * The error this side ends with for a failure (the peer's, named `peer`, or with `peer` '' this
 * side's own, sent to the peer already): its code, and its message.
 */
export function failedPeerError(peer: string, failure: { code?: string; message: string }): Error & { code?: string } {
  const e: Error & { code?: string } = new Error(peer ? `${peer} failed: ${failure.message}` : failure.message);
  if (failure.code) e.code = failure.code;
  return e;
}

/** Errors that mean the link itself is gone: nothing can be sent on it any more. */
export const linkGone = (e: unknown): boolean => {
  const code = (e as { code?: unknown } | null)?.code;
  return code === 'ERR_PEER_GONE' || code === 'ERR_LINK_CLOSED' || code === 'ERR_CLOSED';
};

/** How long a failing side waits for its last message to leave before it closes anyway. */
const FLUSH_MS = 2000;

/** `e` as the consumer's failed reply: `{ ok: false, message, code }` (what the consumer has always answered, with its code now). */
export function failedReply(e: unknown): { ok: false; message: string; code?: string } {
  const { code, message } = failureOf(e).failed;
  return { ok: false, message, ...(code ? { code } : {}) };
}

/**
 * Sends `message` (by default `e` as a Failed message) on `link` unless `e` says the link is gone,
 * and flushes it (close() would drop it); never throws: the original error is what this side reports.
 */
export async function tellPeer<T>(link: { send(value: T): unknown; end(options?: { timeout?: number }): Promise<void> } | undefined, e: unknown, message?: T): Promise<void> {
  if (!link || linkGone(e)) return;
  try {
    link.send(message ?? (failureOf(e) as T));
    await link.end({ timeout: FLUSH_MS });
  } catch {
    // The link failed too: the peer learns that it closed.
  }
}
