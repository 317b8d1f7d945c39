#!/usr/bin/env node
// Builds the prebuilt addons the package ships: prebuilds/linux-x64 and prebuilds/linux-arm64
// (glibc), with prebuildify (N-API, so one build serves every Node version), each with the Python
// package's native helper next to it (cuda_ipc_py.so, binding.gyp's second target, loaded by
// python/cuda_ipc/native/addon.py with ctypes). The machine's own
// architecture is built natively; the other is cross-compiled with Debian's toolchain
// (g++-aarch64-linux-gnu or g++-x86-64-linux-gnu): Node's N-API headers do not depend on the
// architecture. Each build runs in a staging copy of binding.gyp and native/, so the
// developer's build/ (which node-gyp-build prefers) is never replaced by a foreign binary.
//
//   npm run prebuilds                      both targets (what `npm pack` runs)
//   npm run prebuilds -- --arch x64        one target
//   CUDA_IPC_PREBUILD_ARCHS=x64 npm pack   pack with one target (`npm pack` passes no arguments
//                                          to this script, so the choice goes in the environment)
//   ... --out DIR                          write DIR/linux-<arch>/ instead of prebuilds/
// Every target's toolchain is checked before anything is built, and a missing one fails with the
// command that works from where the script was started (npm pack, or npm run prebuilds).
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, openSync, readSync, closeSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { arch as hostArch, tmpdir } from 'node:os';
import { delimiter, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The Python package's native helper, built by binding.gyp beside the addon. */
const PY_HELPER = 'cuda_ipc_py.so';
const TARGETS = {
  x64: { triple: 'x86_64-linux-gnu', debianPackage: 'g++-x86-64-linux-gnu', elfMachine: 62 },
  arm64: { triple: 'aarch64-linux-gnu', debianPackage: 'g++-aarch64-linux-gnu', elfMachine: 183 },
};

class BuildError extends Error {}

/** Stops the script with `message` (through main's catch, so that staging copies are removed first). */
function fail(message) {
  throw new BuildError(message);
}

function parseArgs(argv) {
  let archs = (process.env.CUDA_IPC_PREBUILD_ARCHS ?? 'x64,arm64').split(',').map((a) => a.trim()).filter(Boolean);
  let out = join(root, 'prebuilds');
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--arch') archs = (argv[++i] ?? '').split(',').filter(Boolean);
    else if (a === '--out') out = resolve(argv[++i] ?? fail('--out needs a directory'));
    else if (a === '--help' || a === '-h') {
      console.log('usage: node scripts/prebuild.mjs [--arch x64,arm64] [--out DIR]   (see the comment at the top)');
      process.exit(0);
    } else fail(`unknown argument '${a}'; use --arch x64,arm64 and --out DIR`);
  }
  for (const a of archs) if (!(a in TARGETS)) fail(`--arch ${a}: this script builds ${Object.keys(TARGETS).join(' and ')}`);
  if (archs.length === 0) fail('no architecture to build');
  return { archs, out };
}

function onPath(command) {
  return (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, command)));
}

/** node-gyp: npm's own (npm sets npm_config_node_gyp for scripts), else one on PATH, else the one next to this node's npm. */
function nodeGyp() {
  if (process.env.npm_config_node_gyp) return process.env.npm_config_node_gyp;
  if (onPath('node-gyp')) return 'node-gyp';
  const bundled = join(dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
  if (existsSync(bundled)) return bundled;
  fail('node-gyp not found: run this as `npm run prebuilds`, or install node-gyp');
}

/**
 * Where node-gyp finds Node's headers without a download: npm's configured nodedir, this Node's
 * own install prefix (/usr/include/node), or node-gyp's cache of this version. The headers of the
 * running Node serve every target: the addon uses N-API only. Undefined: node-gyp downloads them.
 */
function nodeHeaders() {
  if (process.env.npm_config_nodedir) return process.env.npm_config_nodedir;
  const candidates = [
    resolve(dirname(process.execPath), '..'),
    join(process.env.XDG_CACHE_HOME ?? join(process.env.HOME ?? '', '.cache'), 'node-gyp', process.versions.node),
  ];
  return candidates.find((d) => existsSync(join(d, 'include', 'node', 'node_api.h')));
}

/** What to run to build only this machine's target, from where this script was started. */
function onlyThisMachine() {
  const lifecycle = process.env.npm_lifecycle_event;
  if (lifecycle === 'prepack' || lifecycle === 'prepublishOnly') {
    return `pack with this machine's target only (the tarball then has no other prebuild; installs there build from source): CUDA_IPC_PREBUILD_ARCHS=${hostArch()} npm pack`;
  }
  return `build only this machine's target: npm run prebuilds -- --arch ${hostArch()} (for npm pack: CUDA_IPC_PREBUILD_ARCHS=${hostArch()} npm pack)`;
}

/** The compilers for `arch`: the host's own, or the cross toolchain (an error that says how to get it). */
function toolchain(arch) {
  if (arch === hostArch()) return { env: {}, strip: 'strip' };
  const t = TARGETS[arch];
  const env = {
    CC: process.env[`CC_${arch}`] ?? `${t.triple}-gcc`,
    CXX: process.env[`CXX_${arch}`] ?? `${t.triple}-g++`,
  };
  env.LINK = env.CXX;
  const strip = process.env[`STRIP_${arch}`] ?? `${t.triple}-strip`;
  for (const tool of [env.CXX, strip]) {
    if (!onPath(tool) && !existsSync(tool)) {
      fail(
        `linux-${arch} is cross-compiled on this ${hostArch()} machine and ${tool} is not installed. ` +
          `On Debian or Ubuntu: apt-get install -y ${t.debianPackage}; or set CXX_${arch} / STRIP_${arch}; ` +
          `or ${onlyThisMachine()}`,
      );
    }
  }
  return { env, strip };
}

/** e_machine of an ELF shared object, checked to be 64-bit little-endian ET_DYN. */
function elfMachine(file) {
  const fd = openSync(file, 'r');
  const h = Buffer.alloc(20);
  try {
    readSync(fd, h, 0, 20, 0);
  } finally {
    closeSync(fd);
  }
  if (h.readUInt32BE(0) !== 0x7f454c46) fail(`${file} is not an ELF file`);
  if (h[4] !== 2 || h[5] !== 1 || h.readUInt16LE(16) !== 3) fail(`${file} is not a 64-bit little-endian shared object`);
  return h.readUInt16LE(18);
}

/** The newest GLIBC_x.y symbol version the binary needs (readelf, where binutils are installed). */
function glibcNeeded(file) {
  const r = spawnSync('readelf', ['-V', '-W', file], { encoding: 'utf8' });
  if (r.status !== 0) return undefined;
  const versions = [...r.stdout.matchAll(/GLIBC_(\d+)\.(\d+)/g)].map((m) => [Number(m[1]), Number(m[2])]);
  versions.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const v = versions.at(-1);
  return v ? `${v[0]}.${v[1]}` : undefined;
}

function build(arch, out) {
  const { env, strip } = toolchain(arch);
  // node-gyp compiles the native files (one per concept) in parallel unless JOBS says otherwise.
  if (!process.env.JOBS) env.JOBS = 'max';
  const stage = mkdtempSync(join(tmpdir(), `cuda-ipc-prebuild-${arch}-`));
  try {
    for (const f of ['binding.gyp', 'package.json', 'native']) cpSync(join(root, f), join(stage, f), { recursive: true });
    symlinkSync(join(root, 'node_modules'), join(stage, 'node_modules'), 'dir');
    const prebuildify = join(root, 'node_modules', 'prebuildify', 'bin.js');
    const args = [prebuildify, '--napi', '--target', process.versions.node, '--strip', '--tag-libc', '--arch', arch, '--strip-bin', strip, '--node-gyp', nodeGyp()];
    const headers = nodeHeaders();
    if (headers) env.npm_config_nodedir = headers;
    console.log(`prebuild: linux-${arch}: prebuildify ${args.slice(1).join(' ')}${env.CXX ? ` (CXX=${env.CXX})` : ''}${headers ? ` (Node headers: ${headers})` : ''}`);
    const r = spawnSync(process.execPath, args, { cwd: stage, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env }, encoding: 'utf8' });
    if (r.status !== 0) {
      process.stderr.write(r.stdout.slice(-8000) + r.stderr.slice(-8000));
      fail(`linux-${arch}: the build failed (exit ${r.status}); the compiler's output is above`);
    }
    const made = join(stage, 'prebuilds', `linux-${arch}`);
    const files = readdirSync(made).filter((f) => f.endsWith('.node'));
    if (files.length !== 1) fail(`linux-${arch}: expected one .node file from prebuildify, got ${files.join(', ') || 'none'}`);
    const machine = elfMachine(join(made, files[0]));
    if (machine !== TARGETS[arch].elfMachine) fail(`linux-${arch}: ${files[0]} was built for ELF machine ${machine}, not ${TARGETS[arch].elfMachine}`);
    // prebuildify copies the build's shared libraries (the Python helper) next to the addon.
    if (!existsSync(join(made, PY_HELPER))) fail(`linux-${arch}: the build made no ${PY_HELPER} (binding.gyp's cuda_ipc_py target)`);
    const helperMachine = elfMachine(join(made, PY_HELPER));
    if (helperMachine !== TARGETS[arch].elfMachine) fail(`linux-${arch}: ${PY_HELPER} was built for ELF machine ${helperMachine}, not ${TARGETS[arch].elfMachine}`);
    const dest = join(out, `linux-${arch}`);
    rmSync(dest, { recursive: true, force: true });
    mkdirSync(dest, { recursive: true });
    for (const f of [files[0], PY_HELPER]) {
      cpSync(join(made, f), join(dest, f));
      const glibc = glibcNeeded(join(dest, f));
      console.log(`prebuild: linux-${arch}: ${join(dest, f)}${glibc ? `, needs glibc ${glibc} or newer` : ''}`);
    }
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

try {
  const { archs, out } = parseArgs(process.argv.slice(2));
  if (process.platform !== 'linux') fail(`the prebuilds are Linux binaries; this is ${process.platform}`);
  for (const arch of archs) toolchain(arch);  // all checked before the first build starts
  for (const arch of archs) build(arch, out);
  noteLeftovers(archs, out);
} catch (e) {
  if (!(e instanceof BuildError)) throw e;
  console.error(`prebuild: ${e.message}`);
  process.exitCode = 1;
}

function noteLeftovers(archs, out) {
  // A target not built now but left from an earlier build would be packed as it is: say so.
  for (const left of readdirSync(out).filter((d) => !archs.some((a) => d === `linux-${a}`))) {
    console.log(`prebuild: note: ${join(out, left)} was not rebuilt now (it is from an earlier build); remove it or build it too`);
  }
}
