// Line coverage of the TypeScript sources (c8 over the V8 coverage that every test process, and
// every process or worker it starts, writes to NODE_V8_COVERAGE), for scripts/run-tests.mjs.
// The modules that hold bounds and checks (issue 41; the same as the mutation groups of
// stryker.config.mjs) have a floor: a whole run that covers fewer of their lines fails.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const C8 = join(root, 'node_modules', 'c8', 'bin', 'c8.js');

/** Module -> the least percentage of its lines a whole run of the suite must cover: a few points
 * under what the tests that cover each module reached on their own (measured on 2026-11-28). */
export const FLOORS = {
  'src/link/transport/tcp-auth.ts': 90,
  'src/link/connect/tcp-listener.ts': 85,
  'src/link/connect/listener.ts': 85,
  'src/link/transport/frame.ts': 95,
  'src/link/connection/frame-dispatch.ts': 75,
  'src/link/messages/message-decoder.ts': 90,
  'src/safe-files.ts': 90,
  'src/channel/slot-ring.ts': 85,
  'src/channel/consumer.ts': 80,
  'src/link/messages/nccl-records.ts': 95,
  'src/tensors/nccl-wire.ts': 95,
};

/** Why coverage cannot be measured here, or undefined. */
export function coverageUnavailable() {
  return existsSync(C8) ? undefined : 'c8 is not installed (npm install installs the devDependencies)';
}

/**
 * Reports the coverage recorded in `tempDir`: a summary of all of src, one row per module with a
 * floor. With `enforce`, returns false when a module is under its floor or missing from the run.
 */
export function reportCoverage(tempDir, enforce) {
  const reportDir = join(tempDir, 'report');
  const r = spawnSync(process.execPath, [
    C8, 'report', '--temp-directory', tempDir, '--report-dir', reportDir, '--merge-async',
    '--include', 'dist/src/**', '--reporter', 'json-summary', '--reporter', 'text-summary',
  ], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  let summary;
  try {
    summary = JSON.parse(readFileSync(join(reportDir, 'coverage-summary.json'), 'utf8'));
  } catch {
    console.log(`coverage: c8 wrote no summary (exit ${r.status}); its output above says why`);
    return !enforce;
  }
  const byModule = new Map(Object.entries(summary).map(([file, s]) => [relative(root, file), s]));
  let ok = true;
  console.log('coverage of the modules with a floor (lines, branches, functions):');
  for (const [module, floor] of Object.entries(FLOORS)) {
    // A module moved to another folder (same file name, the only one) is still found.
    const moved = [...byModule.keys()].filter((k) => k.endsWith(`/${module.split('/').pop()}`));
    const s = byModule.get(module) ?? (moved.length === 1 ? byModule.get(moved[0]) : undefined);
    const pct = s ? s.lines.pct : 0;
    const under = pct < floor;
    if (under) ok = false;
    const row = s ? `${pct.toFixed(1).padStart(5)}% ${s.branches.pct.toFixed(1).padStart(5)}% ${s.functions.pct.toFixed(1).padStart(5)}%` : '  not loaded by any test';
    console.log(`  ${module.padEnd(30)} ${row}  (floor ${floor}% of lines)${under ? '  UNDER THE FLOOR' : ''}`);
  }
  if (!ok && enforce) console.log('coverage: a module is under its floor (scripts/coverage.mjs): test what its lines do, or say in review why the floor moves');
  return ok || !enforce;
}
