// "Allocation gone" notices (PROTOCOL.md 3.2): a process that freed memory it had shared on a link
// tells the peer, in a GONE frame, so that the peer drops what it keeps of that memory without a
// user of it: an idle cached mapping (a legacy handle), an imported pool, a cache of its own.
// Notices are advice: an entry of a kind nobody here registered for is ignored, and they go only
// to peers whose HELLO announced that they accept them (feature bit 1).
//
// Sending: announceGone(link, kind, key); entries announced in one event-loop turn travel together.
// Receiving: registerGoneHandler(kind, handler) for every link of this process; `key` is what the
// sender's kind puts there (for 'legacy-buffer' the 64-byte CUipcMemHandle, for 'ipc-pool' the
// 16-byte pool id).
import { invalidArgType, invalidArgValue } from '../../arg-errors.js';
import { MAX_GONE_KEY_BYTES, type GoneEntry } from '../transport/frame.js';

export type GoneHandler = (key: Uint8Array, link: object) => void;

const handlers = new Map<string, Set<GoneHandler>>();
const KIND_RE = /^[\x21-\x7e]{1,64}$/;

/**
 * Runs `handler(key, link)` for each GONE entry of `kind` that arrives on any link of this
 * process (several handlers may watch one kind: the package's own caches and yours). Returns a
 * function that unregisters it.
 */
export function registerGoneHandler(kind: string, handler: GoneHandler): () => void {
  if (typeof kind !== 'string' || !KIND_RE.test(kind)) throw invalidArgValue(`a gone kind must be 1..64 printable ASCII characters; got ${JSON.stringify(kind)}`);
  if (typeof handler !== 'function') throw invalidArgType('registerGoneHandler: handler must be a function');
  let set = handlers.get(kind);
  if (!set) handlers.set(kind, (set = new Set()));
  set.add(handler);
  return () => {
    set.delete(handler);
  };
}

/** Hands received entries to their handlers; a handler that throws is reported, not rethrown. */
export function dispatchGone(entries: readonly GoneEntry[], link: object): void {
  for (const e of entries) {
    const set = handlers.get(e.kind);
    if (!set) continue;
    for (const h of set) {
      try {
        h(e.key, link);
      } catch (err) {
        process.emitWarning(`a gone handler for '${e.kind}' threw: ${String((err as Error)?.message ?? err)}`, { code: 'CUDA_IPC_GONE_HANDLER' });
      }
    }
  }
}

/** What a link does with notices: gone.ts collects them, the link sends them. */
export interface GoneSender {
  /** False when the link is closed or its peer does not take notices. */
  readonly acceptsGone: boolean;
  sendGone(entries: readonly GoneEntry[]): void;
}

const pending = new Map<GoneSender, GoneEntry[]>();
let scheduled = false;

function flush(): void {
  scheduled = false;
  const all = [...pending];
  pending.clear();
  for (const [link, entries] of all) {
    if (!link.acceptsGone) continue;
    try {
      link.sendGone(entries);
    } catch {
      // The link is going away: the peer's mappings go with it.
    }
  }
}

/**
 * Tells the peer of `link` that the allocation of `kind` named by `key` is gone (batched with
 * others announced in this turn of the event loop). Returns false, sending nothing, when the link
 * is closed or its peer does not take notices.
 */
export function announceGone(link: GoneSender, kind: string, key: Uint8Array): boolean {
  if (typeof kind !== 'string' || !KIND_RE.test(kind)) throw invalidArgValue(`a gone kind must be 1..64 printable ASCII characters; got ${JSON.stringify(kind)}`);
  if (!(key instanceof Uint8Array)) throw invalidArgType('announceGone: key must be a Uint8Array');
  if (key.byteLength > MAX_GONE_KEY_BYTES) throw invalidArgValue(`announceGone: a key holds at most ${MAX_GONE_KEY_BYTES} bytes; got ${key.byteLength}`);
  if (!link.acceptsGone) return false;
  let list = pending.get(link);
  if (!list) pending.set(link, (list = []));
  list.push({ kind, key: key.slice() });
  if (!scheduled) {
    scheduled = true;
    queueMicrotask(flush);
  }
  return true;
}
