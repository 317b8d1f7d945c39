// The process loadNcclSync() runs to find NCCL without waiting on this process's event loop: it runs
// loadNccl() (whose own probe process loads each candidate first) and prints one JSON line, the
// library it chose ({"ok": true, "path", "source"}) or why there is none ({"ok": false, "message",
// "attempts"}).
import { loadNccl } from './library.js';
import type { NcclUnavailableError } from './errors.js';

loadNccl().then(
  (lib) => process.stdout.write(JSON.stringify({ ok: true, path: lib.path, source: lib.source }) + '\n'),
  (e: unknown) => {
    const err = e as Partial<NcclUnavailableError>;
    process.stdout.write(JSON.stringify({ ok: false, message: String(err.message ?? e), attempts: err.attempts ?? [] }) + '\n');
  },
);
