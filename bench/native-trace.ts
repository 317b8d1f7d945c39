// For the breakdown: marks the start and end of every call into the addon (CUDA driver calls,
// system calls such as mmap, fstat, close), so that each phase can say how much of its time was
// spent inside native calls and how many it made; the rest is JavaScript. Only while a recorder
// is installed: the addon's functions are wrapped then and restored afterwards.
import { addon } from '../src/native/addon.js';

type Fn = (...args: unknown[]) => unknown;

/**
 * Wraps the addon's functions (and SharedMemory's construction, which maps, and its methods) so
 * that `mark(call)` and `mark(ret)` bracket each call. Returns the function that undoes it. Socket
 * methods are left alone: the link's own probes time sendmsg().
 */
export function traceNativeCalls(mark: (point: number) => void, call: number, ret: number): () => void {
  const exports = addon as unknown as Record<string, unknown>;
  const saved: Array<{ target: Record<string, unknown>; name: string; value: unknown }> = [];
  const traced = (fn: Fn): Fn =>
    function traced(this: unknown, ...args: unknown[]): unknown {
      mark(call);
      try {
        return fn.apply(this, args);
      } finally {
        mark(ret);
      }
    };
  for (const name of Object.keys(exports)) {
    // Classes (Socket, SharedMemory, Acceptor, ...) are constructors, not calls to wrap.
    const fn = exports[name];
    if (typeof fn !== 'function' || /^[A-Z]/.test(name)) continue;
    saved.push({ target: exports, name, value: fn });
    exports[name] = traced(fn as Fn);
  }
  // SharedMemory's methods are read-only on its prototype: a subclass overrides them, for the
  // mappings made while tracing.
  const Native = exports.SharedMemory as new (fd: number, length: number) => object;
  class TracedSharedMemory extends Native {
    constructor(fd: number, length: number) {
      mark(call);
      try {
        super(fd, length);
      } finally {
        mark(ret);
      }
    }
  }
  const proto = Native.prototype as Record<string, unknown>;
  for (const name of ['close', 'copyOut', 'copyIn', 'arrayBuffer']) {
    // defineProperty: assigning would fail, the inherited property being read-only.
    if (typeof proto[name] === 'function') Object.defineProperty(TracedSharedMemory.prototype, name, { value: traced(proto[name] as Fn) });
  }
  saved.push({ target: exports, name: 'SharedMemory', value: Native });
  exports.SharedMemory = TracedSharedMemory;
  return () => {
    for (const { target, name, value } of saved.reverse()) target[name] = value;
  };
}
