// StrykerJS over the modules that hold bounds and checks (issue 41), one group at a time: each
// group's modules are mutated against only the test files that cover them, so that a run fits two
// shared cores. `npm run test:mutation` (scripts/mutation.mjs) runs every group, or the ones named:
// `npm run test:mutation -- ring frames`. docs/MUTATION.md has the scores and the survivors.
//
// Stryker copies the repository into .stryker-tmp/, inserts every mutant at once (switched by an
// environment variable), compiles it with tsc and runs the compiled tests with its TAP runner
// (node:test prints TAP when its output is not a terminal). Child processes that the tests spawn
// inherit the variable, so a mutant is live in them too.

import { readFileSync } from 'node:fs';

/** `file:first-last`: the lines from the first holding `from` to the next holding `to`, found by
 * their text so that edits elsewhere in the file do not move the range. */
function lines(file, from, to) {
  const text = readFileSync(new URL(file, import.meta.url), 'utf8').split('\n');
  const first = text.findIndex((l) => l.includes(from));
  const last = first < 0 ? -1 : text.findIndex((l, i) => i >= first && l.includes(to));
  if (last < 0) throw new Error(`stryker.config.mjs: ${file} has no line holding ${JSON.stringify(first < 0 ? from : to)}; update the range`);
  return `${file}:${first + 1}-${last + 1}`;
}

/** Group name -> the modules (or line ranges of them) and the compiled tests that cover them. */
export const groups = {
  // The ring's corruption checks: positions, ring entries, slot records, releasers.
  ring: {
    mutate: [
      lines('src/channel/slot-ring.ts', 'export function corrupt(', '}'),
      lines('src/channel/slot-ring.ts', '#pos(off: number', 'return v;'),
      // take(): the tail/head window and the ring entry (not its compare-and-swap protocol).
      lines('src/channel/slot-ring.ts', "let h = this.#pos(H.head, 'head');", 'if (s >= this.n) throw corrupt('),
      lines('src/channel/slot-ring.ts', 'peekAt(cursor: number): number {', 'return s;'),
      // #message(): the length and meta bounds of a slot record.
      lines('src/channel/consumer.ts', '#message(s: number, position: number)', "throw corrupt(`message in slot ${s}: its meta is not JSON`)"),
      // (producer.ts's check of the releaser's index runs only with device slots: GPU tests.)
    ],
    tests: ['channel-ring', 'channel-corrupt', 'channel-layout'],
  },
  // frame.ts's checks: parseHeader, readU64, readGoneEntries, readReleaseIds (its encoders and
  // constants left out: a mutant there breaks every round trip, and the run would take hours).
  frames: {
    mutate: [
      lines('src/link/transport/frame.ts', 'export function parseHeader(', 'return high >= 0x20_0000'),
      lines('src/link/transport/frame.ts', 'export function readGoneEntries(', 'return ids;'),
    ],
    tests: ['frame-bounds', 'link-frame', 'link-fuzz', 'link-large'],
  },
  'frame-dispatch': {
    mutate: ['src/link/connection/frame-dispatch.ts'],
    // frame-dispatch first: every frame at the dispatcher's seam, under a second a run. link-fuzz
    // (11 s a run) and link-ring / link-gone reach it too but add a run per mutant, not kills.
    tests: ['frame-dispatch', 'link-frame', 'link-large'],
    // Unit tests of a second: a mutant that loops forever is called a timeout after 10 s, not 30.
    timeoutMS: 10_000,
  },
  decoder: {
    mutate: ['src/link/messages/message-decoder.ts'],
    // message-decoder first: payloads built byte by byte, under a second a run. link-fuzz (11 s a
    // run) kills nothing that message-decoder does not.
    tests: ['message-decoder', 'link-frame', 'link-large'],
    timeoutMS: 10_000,
  },
  'safe-files': {
    mutate: ['src/safe-files.ts'],
    // security-files drives these through the CLI too, but takes 11 s a run: too slow per mutant.
    tests: ['safe-files'],
  },
  nccl: {
    mutate: ['src/link/messages/nccl-records.ts', 'src/tensors/nccl-wire.ts'],
    tests: ['nccl-records', 'nccl-records-bounds'],
  },
  listener: {
    mutate: ['src/link/connect/listener.ts'],
    // security-links (13 s a run) also covers it: too slow per mutant. listener-pending first: the
    // pending bounds, fd exhaustion and connect()'s waits.
    tests: ['listener-pending', 'listener-connect', 'link-listen', 'link-uid', 'link-limits'],
    // Much of this module runs in the tests' children: listener-pending's EMFILE test runs the
    // listener in a child (under `ulimit -n 200`), link-uid's connect() runs as 'nobody'. A child
    // loads the sandbox's compiled, mutated dist/ (its fixtures import ../../src/) and inherits the
    // active mutant, but the TAP runner sees coverage in the test process only, and reports it
    // whatever coverageAnalysis says, so those mutants came out 'not covered' or were never run
    // against the file that reaches them. The command runner has no coverage: every mutant runs
    // the files one after another until one fails (about 7 s for a mutant that survives).
    runner: 'command',
  },
  tcp: {
    mutate: ['src/link/transport/tcp-auth.ts', 'src/link/connect/tcp-listener.ts'],
    // tcp-auth first (the token exchange at its seam, chunk by chunk; under a second a run), then
    // tcp-listener-bounds (the listener's timeouts, per-address bound, close, binding; 3 s a run);
    // link-tcp-flood (8 s a run) covers the same bounds under a flood, left out.
    tests: ['tcp-auth', 'tcp-listener-bounds', 'link-tls-client-certs', 'link-tcp', 'link-tcp-hostile', 'link-tcp-crash'],
  },
};

const name = process.env.CUDA_IPC_MUTATION_GROUP ?? 'nccl';
const group = groups[name];
if (!group) throw new Error(`stryker.config.mjs: no mutation group "${name}" (one of ${Object.keys(groups).join(', ')})`);

// CUDA_IPC_MUTATION_TESTS=a,b: only those test files (to iterate on one module's tests).
const testFiles = (process.env.CUDA_IPC_MUTATION_TESTS?.split(',') ?? group.tests).map((t) => `dist/test/cpu/${t}.test.js`);
// CUDA_IPC_MUTATION_RUNNER=command|tap overrides the group's runner.
const command = (process.env.CUDA_IPC_MUTATION_RUNNER ?? group.runner ?? 'tap') === 'command';

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  testRunner: command ? 'command' : 'tap',
  plugins: ['@stryker-mutator/tap-runner'],
  // CUDA_IPC_MUTATION_MUTATE=file,file: only those of the group's modules (or ranges).
  mutate: process.env.CUDA_IPC_MUTATION_MUTATE?.split(',') ?? group.mutate,
  tap: {
    testFiles,
    nodeArgs: ['--test-reporter=tap', '--test-force-exit'],
  },
  // The command runner (a shell): each file in turn, stopping at the first that fails.
  commandRunner: { command: testFiles.map((f) => `node --test --test-force-exit --test-reporter=dot ${f}`).join(' && ') },
  // The sandbox compiles the mutated sources itself; the checked-in dist/ is not copied.
  ignorePatterns: ['dist', 'prebuilds', '.gpu', '.whl', '*.tgz'],
  // tsc, then the sandbox made readable by 'nobody' (scripts/mutation-build.mjs says why).
  buildCommand: 'node scripts/mutation-build.mjs',
  // TAP runner: per test file, a mutant runs only the files whose run reached it (in the test
  // process). The command runner has no coverage: every mutant runs the command.
  coverageAnalysis: command ? 'off' : 'perTest',
  concurrency: Number(process.env.CUDA_IPC_MUTATION_CONCURRENCY ?? 2),
  // Tests of sockets and processes vary under load: a generous margin before a mutant is called
  // a timeout (which counts as detected).
  timeoutMS: Number(process.env.CUDA_IPC_MUTATION_TIMEOUT_MS ?? group.timeoutMS ?? 30_000),
  timeoutFactor: 3,
  tempDirName: process.env.CUDA_IPC_MUTATION_TMP ?? '.stryker-tmp',
  cleanTempDir: true,
  reporters: ['clear-text', 'json', 'progress-append-only'],
  jsonReporter: { fileName: `reports/mutation/${name}.json` },
  clearTextReporter: { allowColor: false, logTests: false, reportMutants: true, reportScoreTable: true },
  thresholds: { high: 90, low: 80, break: null },
  disableTypeChecks: true,
  // The wording of error messages is not a bound: tests check codes (and some messages), and
  // mutating every message would double the run. docs/MUTATION.md says so.
  mutator: { excludedMutations: ['StringLiteral'] },
};
