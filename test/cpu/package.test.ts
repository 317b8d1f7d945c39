// The package as a new user gets it: `npm pack` (which builds the prebuilds), the tarball installed
// with --ignore-scripts into a fresh app next to the newest TypeScript and @types/node from the
// registry (and TypeScript 6 and 5.9), then:
// - the tarball holds what its docs link and the README promises, no tests, maps or sources;
// - the addon that loads is the prebuilt one for this machine; the other architecture's is an
//   ELF for that machine; without one that fits, the error says how to build from source;
// - the README's examples and test/types/api.ts type-check with each TypeScript's `tsc --init`
//   settings plus strict and skipLibCheck false, for nodenext and bundler resolution, and as
//   CommonJS; the CPU examples run (ESM) and so does a CommonJS program (require() of the package).
// Everything happens in one temporary directory per run (one install serves every case); npm's
// own cache makes a second run's installs fast. It needs the npm registry (without npm or a
// reachable registry it skips, saying so); CUDA_IPC_SKIP_PACKAGE_TEST=1 skips it too.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { closeSync, cpSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { arch, tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readmeExamples, strictUserTsconfig, writePrograms, type ReadmeProgram } from '../helpers/readme.js';
import { noNpmRegistry } from '../helpers/tools.js';
import { noPython, PYTHON } from '../helpers/python.js';
import { brokenLinks } from '../helpers/doc-links.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { name: string; version: string };
const host = arch();
const other = host === 'x64' ? 'arm64' : 'x64';
const crossCompiler = other === 'arm64' ? 'aarch64-linux-gnu-g++' : 'x86_64-linux-gnu-g++';
const haveCross = (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, crossCompiler)));
const skipAll = process.env.CUDA_IPC_SKIP_PACKAGE_TEST === '1' ? 'CUDA_IPC_SKIP_PACKAGE_TEST=1'
  : process.arch !== 'x64' && process.arch !== 'arm64' ? `no prebuild target for ${process.arch}`
  : noNpmRegistry();
const noCross = haveCross ? undefined : `no ${crossCompiler} here to build the linux-${other} prebuild (apt-get install -y g++-${other === 'arm64' ? 'aarch64-linux-gnu' : 'x86-64-linux-gnu'})`;

/** TypeScript versions: the newest (what `npm i -D typescript` installs), and the lines before it. */
const TYPESCRIPTS = [
  { alias: 'typescript', spec: 'typescript@latest' },
  { alias: 'ts6', spec: 'ts6@npm:typescript@^6' },
  { alias: 'ts5', spec: 'ts5@npm:typescript@~5.9' },
] as const;

let dir = '';
let app = '';
let tarball = '';
let tarFiles: string[] = [];
const programs: ReadmeProgram[] = readmeExamples(join(root, 'README.md')).programs;

function run(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = {}, timeout = 300_000): SpawnSyncReturns<string> {
  const t0 = performance.now();
  const r = spawnSync(command, args, { cwd, encoding: 'utf8', env: { ...process.env, ...env }, timeout, maxBuffer: 64 << 20 });
  console.log(`# ${command === process.execPath ? 'node' : command} ${args.join(' ')}  (${((performance.now() - t0) / 1000).toFixed(1)} s, exit ${r.status})`);
  return r;
}

function must(r: SpawnSyncReturns<string>, what: string): string {
  assert.equal(r.status, 0, `${what} failed (exit ${r.status}${r.error ? `, ${r.error.message}` : ''}):\n${r.stdout.slice(-6000)}${r.stderr.slice(-6000)}`);
  return r.stdout;
}

const tscOf = (alias: string) => join(app, 'node_modules', alias, 'bin', 'tsc');
const installed = join('node_modules', pkg.name);

/**
 * What a package must not hold: files only tests use. A new test-only file in a shipped folder
 * (native/, dist/src/, python/cuda_ipc/) must match one of these or be left out in package.json
 * "files" (as the ABI checks are: "!native/abi_check.cc").
 */
const TEST_ONLY: readonly { pattern: RegExp; what: string }[] = [
  { pattern: /^(dist\/)?test\//, what: 'tests, their fixtures and helpers (test/, dist/test/)' },
  { pattern: /(^|\/)(fixtures|helpers)\//, what: 'test fixtures and helpers' },
  { pattern: /\.test\.(js|mjs|ts|d\.ts)$|(^|\/)test_[^/]*\.py$|(^|\/)tests\//, what: 'test files' },
  { pattern: /(^|\/)(nccl-)?testing\.(js|d\.ts)$/, what: 'stand-ins for tests (the former dist/src/nccl/testing.js, now test/helpers/nccl-testing.ts)' },
  { pattern: /^native\/(nccl_)?abi_check\.cc$/, what: 'the ABI checks test/cpu/abi-header.test.ts and nccl-abi.test.ts compile (not part of the addon)' },
  { pattern: /fake[-_]?nccl/, what: 'the fake libnccl of the tests' },
  { pattern: /(^|\/)(\.?stryker[^/]*|coverage|reports)(\/|$)/, what: 'mutation testing and coverage' },
  { pattern: /^(bench|examples|scripts|build)\//, what: 'benchmarks, examples, scripts and the local build (the repository, not the package)' },
];

/** The files of `files` that are test-only, each with why; and native sources no target of binding.gyp builds. */
function testOnlyFiles(files: readonly string[]): string[] {
  const found: string[] = [];
  for (const f of files) {
    const hit = TEST_ONLY.find((t) => t.pattern.test(f));
    if (hit) found.push(`${f}: ${hit.what} (${hit.pattern})`);
  }
  const gyp = readFileSync(join(root, 'binding.gyp'), 'utf8');
  for (const f of files.filter((x) => /^native\/.*\.(cc|c)$/.test(x))) {
    if (!gyp.includes(`"${f}"`)) found.push(`${f}: a native source no target of binding.gyp builds`);
  }
  return found;
}

// Packing builds the addon once per target (twice where the cross compiler is here): minutes on a
// 2-core machine, past the runner's 5-minute default for a test or hook.
describe('the packed package, as a new user installs it', { skip: skipAll, timeout: 30 * 60_000 }, () => {
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-package-'));
    app = join(dir, 'app');
    mkdirSync(app);
    // npm pack runs prepack: the TypeScript build and the prebuilds (both targets where the
    // cross compiler is here, else this machine's, as noCross says).
    must(run('npm', ['pack', '--pack-destination', dir], root, haveCross ? {} : { CUDA_IPC_PREBUILD_ARCHS: host }, 20 * 60_000), 'npm pack');
    tarball = join(dir, readdirSync(dir).find((f) => f.endsWith('.tgz'))!);
    tarFiles = must(run('tar', ['tzf', tarball], dir), 'tar tzf').split('\n').filter(Boolean).map((f) => f.replace(/^package\//, ''));
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'new-user-app', private: true, type: 'module' }, null, 2));
    must(run('npm', ['install', '--ignore-scripts', '--no-audit', '--no-fund', tarball, '@types/node@latest', ...TYPESCRIPTS.map((t) => t.spec)], app), 'npm install (from the registry)');
    for (const t of [...TYPESCRIPTS.map((x) => x.alias), '@types/node']) {
      console.log(`# ${t}: ${(JSON.parse(readFileSync(join(app, 'node_modules', t, 'package.json'), 'utf8')) as { version: string }).version}`);
    }
  }, { timeout: 25 * 60_000 });

  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the tarball holds what its docs link, the LICENSE, both prebuilds and the Python package; no tests, maps or sources; each file once', () => {
    for (const f of ['README.md', 'LICENSE', 'package.json', 'docs/PROTOCOL.md', 'docs/channel-protocol.md', 'docs/api/README.md', 'dist/src/index.js', 'dist/src/index.d.ts',
      'python/cuda_ipc/__init__.py', 'python/pyproject.toml', 'python/setup.py', 'python/cuda_ipc/tensors.ptx', 'kernels/builtin.ptx', `prebuilds/linux-${host}/cuda-ipc.glibc.node`,
      `prebuilds/linux-${host}/cuda_ipc_py.so`, 'native/py/channel_ring.c', 'binding.gyp']) {
      assert.ok(tarFiles.includes(f), `the tarball lacks ${f}`);
    }
    if (haveCross) assert.ok(tarFiles.includes(`prebuilds/linux-${other}/cuda-ipc.glibc.node`), `the tarball lacks the linux-${other} prebuild`);
    if (haveCross) assert.ok(tarFiles.includes(`prebuilds/linux-${other}/cuda_ipc_py.so`), `the tarball lacks the linux-${other} Python helper`);
    assert.ok(!tarFiles.some((f) => f.startsWith('test/') || f.startsWith('dist/test/') || f.startsWith('build/')), 'no tests or local build in the tarball');
    assert.deepEqual(testOnlyFiles(tarFiles), [], 'nothing test-only in the tarball');
    // Test-only helpers live under test/; every module of dist/src is built from src/ now (prepack
    // removed what an earlier build left).
    for (const f of tarFiles.filter((x) => x.startsWith('dist/src/') && x.endsWith('.js'))) {
      assert.ok(existsSync(join(root, f.replace(/^dist\//, '').replace(/\.js$/, '.ts'))), `${f} has no source in src/: a leftover of an earlier build`);
    }
    // No maps and no TypeScript sources (tsconfig.package.json): nothing for a map to point at.
    assert.deepEqual(tarFiles.filter((f) => f.endsWith('.map') || f.startsWith('src/')), []);
    for (const f of tarFiles.filter((x) => x.startsWith('dist/src/'))) {
      assert.doesNotMatch(readFileSync(join(app, installed, f), 'utf8'), /sourceMappingURL/, `${f} names a source map the package does not ship`);
    }
    // The copy kernels' PTX once (the Python package's copy, which the TypeScript side loads too).
    assert.deepEqual(tarFiles.filter((f) => f.endsWith('tensors.ptx')), ['python/cuda_ipc/tensors.ptx']);
    // The whole Python package, subpackages and typing marker (py.typed) included.
    const python = readdirSync(join(root, 'python', 'cuda_ipc'), { recursive: true, encoding: 'utf8' })
      .filter((f) => !f.includes('__pycache__') && /(\.pyi?|py\.typed)$/.test(f)).map((f) => `python/cuda_ipc/${f}`);
    assert.ok(python.length > 0);
    for (const f of python) assert.ok(tarFiles.includes(f), `the tarball lacks ${f}`);
    assert.match(readFileSync(join(root, 'LICENSE'), 'utf8'), /^MIT License/);
    // Every link of the shipped Markdown resolves inside the tarball, or is a public URL.
    const broken = brokenLinks(tarFiles, (f) => readFileSync(join(app, installed, f), 'utf8'));
    assert.deepEqual(broken, [], broken.map((b) => `${b.file}: (${b.target}) ${b.why}`).join('\n'));
  });

  test('installed with --ignore-scripts, the package loads its prebuilt addon for this machine', () => {
    assert.ok(!existsSync(join(app, installed, 'build')), 'nothing was built at install');
    const probe = [
      "import { HostBuffer } from 'cuda-ipc';",
      "import { readFileSync } from 'node:fs';",
      'const b = HostBuffer.allocate(64); b.bytes.fill(7); const ok = b.read(1)[0] === 7; b.close();',
      "const addons = [...new Set(readFileSync('/proc/self/maps', 'utf8').split('\\n').map((l) => l.split(/\\s+/).pop()).filter((p) => p && p.endsWith('.node')))];",
      'console.log(JSON.stringify({ ok, addons }));',
    ].join('\n');
    const out = JSON.parse(must(run(process.execPath, ['--input-type=module', '-e', probe], app), 'importing the installed package')) as { ok: boolean; addons: string[] };
    assert.equal(out.ok, true);
    assert.deepEqual(out.addons.map((p) => p.slice(p.indexOf('prebuilds/'))), [`prebuilds/linux-${host}/cuda-ipc.glibc.node`]);
  });

  test(`the linux-${other} prebuild and Python helper are shared objects for that machine`, { skip: noCross }, () => {
    for (const name of ['cuda-ipc.glibc.node', 'cuda_ipc_py.so']) {
      const file = join(app, installed, 'prebuilds', `linux-${other}`, name);
      const h = Buffer.alloc(20);
      const fd = openSync(file, 'r');
      try {
        readSync(fd, h, 0, 20, 0);
      } finally {
        closeSync(fd);
      }
      assert.equal(h.readUInt32BE(0), 0x7f454c46, `${name}: ELF magic`);
      assert.equal(h[4], 2, `${name}: 64-bit`);
      assert.equal(h[5], 1, `${name}: little-endian`);
      assert.equal(h.readUInt16LE(16), 3, `${name}: a shared object (ET_DYN)`);
      assert.equal(h.readUInt16LE(18), other === 'arm64' ? 183 : 62, `${name}: e_machine ${other === 'arm64' ? 'EM_AARCH64' : 'EM_X86_64'}`);
    }
  });

  test('the installed package\'s Python companion loads its prebuilt native helper', { skip: noPython }, () => {
    const r = run(PYTHON, ['-c', 'import cuda_ipc, json; h = cuda_ipc.native_helper(); print(json.dumps(h._asdict()))'], app, { PYTHONPATH: join(app, installed, 'python') });
    const h = JSON.parse(must(r, 'importing cuda_ipc from the installed package').trim()) as { active: boolean; path: string; reason: string };
    assert.equal(h.active, true, h.reason);
    assert.ok(h.path.endsWith(`prebuilds/linux-${host}/cuda_ipc_py.so`), h.path);
  });

  test('where no prebuild fits, importing fails with ERR_NO_NATIVE_BUILD and says how to build from source', () => {
    const prebuilt = join(app, installed, 'prebuilds', `linux-${host}`);
    const aside = join(dir, 'prebuild-aside');
    renameSync(prebuilt, aside);
    try {
      const r = run(process.execPath, ['--input-type=module', '-e', "import('cuda-ipc').then(() => console.log('loaded'), (e) => console.log(JSON.stringify({ code: e.code, message: e.message })))"], app);
      const e = JSON.parse(must(r, 'the import probe')) as { code: string; message: string };
      assert.equal(e.code, 'ERR_NO_NATIVE_BUILD');
      assert.match(e.message, new RegExp(`no native addon for this machine \\(linux-${host}, glibc [\\d.]+, Node ${process.versions.node}\\)`));
      assert.match(e.message, /npm rebuild cuda-ipc/);
      assert.doesNotMatch(e.message, /No native build was found/);
    } finally {
      renameSync(aside, prebuilt);
    }
  });

  for (const ts of TYPESCRIPTS) {
    test(`the README's examples and the type tests compile with ${ts.spec.replace(/^ts\d@npm:/, '')}'s tsc --init, strict, skipLibCheck false: nodenext, bundler, CommonJS`, () => {
      const base = join(dir, 'cases', ts.alias);
      mkdirSync(base, { recursive: true });
      must(run(process.execPath, [tscOf(ts.alias), '--init'], base), `${ts.alias} --init`);
      const init = readFileSync(join(base, 'tsconfig.json'), 'utf8');
      const cases = [
        { name: 'nodenext', overrides: {}, cjs: false },
        { name: 'bundler', overrides: { module: 'esnext', moduleResolution: 'bundler' }, cjs: false },
        { name: 'commonjs', overrides: {}, cjs: true },
      ];
      for (const c of cases) {
        const d = join(app, 'cases', `${ts.alias}-${c.name}`);
        mkdirSync(d, { recursive: true });
        writeFileSync(join(d, 'tsconfig.json'), strictUserTsconfig(init, c.overrides));
        if (c.cjs) {
          writeFileSync(join(d, 'package.json'), JSON.stringify({ type: 'commonjs' }));
          writeFileSync(join(d, 'app.ts'), COMMONJS_APP);
        } else {
          writePrograms(d, programs);
          cpSync(join(root, 'test', 'types', 'api.ts'), join(d, 'api.ts'));
        }
        must(run(process.execPath, [tscOf(ts.alias), '-p', d], d), `${ts.alias} (${c.name})`);
      }
    });
  }

  test('the README\'s CPU examples run against the installed package and print what the README says (ESM)', () => {
    const d = join(app, 'cases', 'typescript-nodenext');
    for (const p of programs.filter((q) => q.kind === 'cpu')) {
      const out = must(run(process.execPath, [join(d, p.name, p.files[0]!.name.replace(/\.ts$/, '.js'))], join(d, p.name), {}, 60_000), `README program ${p.name}`);
      if (p.expectedOutput !== undefined) assert.equal(out, p.expectedOutput);
    }
  });

  test('a CommonJS program require()s the package and shares a HostBuffer with a child', () => {
    const d = join(app, 'cases', 'typescript-commonjs');
    const out = must(run(process.execPath, [join(d, 'app.js')], d, {}, 60_000), 'the CommonJS program');
    assert.equal(out, 'commonjs: the child summed 512\n');
  });
});

// Without the registry or a build: npm's own list of what `npm pack` would put in the tarball,
// from package.json "files". dist/src files without a source in src/ are left out: a leftover of an
// earlier build here, which prepack removes before packing (the tarball test above checks that).
test('the package\'s file list (npm pack --dry-run) holds nothing test-only, named by pattern', { skip: (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, 'npm'))) ? undefined : 'npm is not on PATH here' }, () => {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8', timeout: 120_000, maxBuffer: 64 << 20 });
  assert.equal(r.status, 0, r.stderr);
  const listed = (JSON.parse(r.stdout) as { files: { path: string }[] }[])[0]!.files.map((f) => f.path);
  const files = listed.filter((f) => !f.startsWith('dist/src/') || existsSync(join(root, f.replace(/^dist\//, '').replace(/\.(d\.ts|js)$/, '.ts'))));
  assert.ok(files.includes('native/addon.cc') && files.includes('python/cuda_ipc/__init__.py'), 'the list is the package\'s');
  assert.deepEqual(testOnlyFiles(files), []);
  // The patterns catch what they name: the ABI checks are in the repository, left out by "files".
  assert.deepEqual(testOnlyFiles(['native/abi_check.cc', 'native/nccl_abi_check.cc', 'dist/src/nccl/testing.js', 'native/addon.cc']).map((f) => f.split(':')[0]),
    ['native/abi_check.cc', 'native/nccl_abi_check.cc', 'dist/src/nccl/testing.js', 'native/abi_check.cc', 'native/nccl_abi_check.cc']);
  assert.ok(existsSync(join(root, 'native/abi_check.cc')) && !listed.includes('native/abi_check.cc') && !listed.includes('native/nccl_abi_check.cc'));
});

/** A CommonJS user's program (`import x = require()`, as verbatimModuleSyntax wants in CJS). */
const COMMONJS_APP = `import ipc = require('cuda-ipc');

async function main(): Promise<void> {
  if (process.argv[2] === 'child') {
    const link = ipc.parentLink<{ buffer: ipc.HostBuffer }, { sum: number }>();
    const { buffer } = await link.receive();
    const sum = buffer.bytes.reduce((a, b) => a + b, 0);
    buffer.close();
    link.send({ sum });
    await link.end();
    return;
  }
  const buffer = ipc.HostBuffer.allocate(256);
  buffer.bytes.fill(2);
  const { link } = await ipc.spawn<{ sum: number }, { buffer: ipc.HostBuffer }>(__filename, ['child']);
  link.send({ buffer });
  const { sum } = await link.receive();
  console.log(\`commonjs: the child summed \${sum}\`);
  buffer.close();
  await link.end();
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
`;
