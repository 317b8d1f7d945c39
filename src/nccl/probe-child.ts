// The throw-away process that loads NCCL candidates before the caller does (probe.ts starts it):
// a library that crashes when loaded takes only this process down. Arguments: the paths to try,
// in order. For each it prints a JSON line {"trying": i}, then {"ok": true, "path", "version"} or
// {"ok": false, "code", "message"}; it stops at the first that loads.
import { nccl } from './native.js';

const paths = process.argv.slice(2);
for (let i = 0; i < paths.length; i++) {
  process.stdout.write(JSON.stringify({ trying: i }) + '\n');
  try {
    const opened = nccl.ncclOpen(paths[i]!);
    process.stdout.write(JSON.stringify({ ok: true, path: opened.path, version: opened.version }) + '\n');
    break;
  } catch (e) {
    const err = e as { code?: unknown; message?: unknown };
    process.stdout.write(JSON.stringify({ ok: false, code: String(err.code ?? 'ERROR'), message: String(err.message ?? e) }) + '\n');
  }
}
