// The slow reader of bench/flood.ts: opens its link, reads nothing for `pauseMs`, then reads (and
// closes) every message, and says how many it got.
import { parentLink } from '../src/link/index.js';

const pauseMs = Number(process.argv[2] ?? 3000);
const link = parentLink();
await new Promise((r) => setTimeout(r, pauseMs));
let got = 0;
for await (const m of link) {
  if (typeof m === 'object' && m !== null && 'done' in m) {
    link.send({ got });
    await link.end();
    break;
  }
  (m as { close(): void }).close();
  got++;
}
