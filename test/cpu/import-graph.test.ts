// Imports run one way, down the layers (LAYERS below; docs/ARCHITECTURE.md draws them), inside the
// link down its own layers (LINK_LAYERS), in TypeScript and in the Python package alike (PY_LAYERS
// mirror them folder for folder), and never in a circle: a newcomer can read any folder knowing only the ones below it, and module
// initialisation order never depends on who was imported first. Type-only imports count as edges
// like any other: a type that must name something above it is a sign that an interface belongs
// lower down.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describeEdge, findCircles, readImportGraph, readPythonImportGraph, type ImportEdge, type ImportGraph } from '../helpers/import-graph.js';

const root = fileURLToPath(new URL('../../..', import.meta.url));

/**
 * Of observe, the layers report through hooks.ts alone; the publisher and the record behind it
 * are observe's own, read from the top (the CLI and the package's API) through reader.ts.
 */
const OBSERVE_INTERFACE = 'src/observe/hooks.ts';
const TOP_RANK = 9;

/**
 * The layers, lowest first. A file may import files of its own layer and of layers with a lower
 * rank. host, ipc and nccl share a rank and stand beside each other: none imports another.
 */
const LAYERS: ReadonlyArray<{ name: string; rank: number; files: RegExp }> = [
  // The small things every layer uses: errors, leak tracking, the private directory.
  { name: 'base', rank: 0, files: /^src\/(errors|arg-errors|abort|leak|half-float|runtime-directory|safe-files|processes)\.ts$/ },
  // The addon: its loader and the types of its functions (native/*.cc), one file per part.
  { name: 'native', rank: 1, files: /^src\/native\// },
  // The status record: a leaf the layers report to through the small interface of hooks.ts.
  { name: 'observe', rank: 2, files: /^src\/observe\// },
  { name: 'cuda', rank: 3, files: /^src\/cuda\// },
  { name: 'host', rank: 4, files: /^src\/host\// },
  { name: 'ipc', rank: 4, files: /^src\/ipc\// },
  // NCCL: device bytes over libnccl (dlopened), beside host and ipc; links and tensors build on it.
  { name: 'nccl', rank: 4, files: /^src\/nccl\// },
  // DeviceArray and HostArray over one base: typed views that links, channels and tensors carry.
  { name: 'arrays', rank: 5, files: /^src\/arrays\// },
  { name: 'link', rank: 6, files: /^src\/link\// },
  { name: 'channel', rank: 7, files: /^src\/channel\// },
  { name: 'tensors', rank: 8, files: /^src\/tensors\// },
  { name: 'cli', rank: TOP_RANK, files: /^src\/cli\// },
  // What the package exposes: everything below, gathered.
  { name: 'api', rank: TOP_RANK + 1, files: /^src\/(index|stats)\.ts$/ },
];

/** Edges that climb: to a higher layer, across to another layer of the same rank, or past hooks.ts into observe. */
function layerViolations(edges: Iterable<ImportEdge>): string[] {
  const out: string[] = [];
  for (const e of edges) {
    const from = layerOf(e.from)!;
    const to = layerOf(e.to)!;
    if (from.name === to.name) continue;
    if (to.rank >= from.rank) {
      out.push(`${describeEdge(e)}: ${from.name} (rank ${from.rank}) must not import ${to.name} (rank ${to.rank})`);
    } else if (to.name === 'observe' && e.to !== OBSERVE_INTERFACE && from.rank < TOP_RANK) {
      out.push(`${describeEdge(e)}: ${from.name} reports to observe through ${OBSERVE_INTERFACE} only`);
    }
  }
  return out;
}

function layerOf(file: string): { name: string; rank: number } | undefined {
  return LAYERS.find((l) => l.files.test(file));
}

const graph = readImportGraph(root);
const edges = [...graph.values()].flat();

test('the import graph of src was read', () => {
  // Guards the test itself: an empty graph would pass everything below.
  assert.ok(graph.size > 80, `only ${graph.size} files found under ${root}src`);
  assert.ok(edges.length > 300, `only ${edges.length} imports found`);
  assert.ok(edges.some((e) => e.typeOnly) && edges.some((e) => e.dynamic), 'type-only imports and import() are read');
});

test('the checks find a planted circle and a planted climb', () => {
  const edge = (from: string, to: string, typeOnly = false): ImportEdge => ({ from, to, typeOnly, dynamic: false, line: 1 });
  const planted: ImportGraph = new Map([
    ['src/link/a.ts', [edge('src/link/a.ts', 'src/link/b.ts')]],
    ['src/link/b.ts', [edge('src/link/b.ts', 'src/link/c.ts')]],
    ['src/link/c.ts', [edge('src/link/c.ts', 'src/link/a.ts', true), edge('src/link/c.ts', 'src/link/d.ts')]],
    ['src/link/d.ts', []],
  ]);
  assert.deepEqual(findCircles(planted), [{ files: ['src/link/a.ts', 'src/link/b.ts', 'src/link/c.ts'], cycle: ['src/link/a.ts', 'src/link/b.ts', 'src/link/c.ts', 'src/link/a.ts'] }]);
  assert.deepEqual(layerViolations([edge('src/cuda/x.ts', 'src/link/y.ts', true), edge('src/ipc/x.ts', 'src/observe/publisher.ts'), edge('src/cuda/x.ts', 'src/observe/hooks.ts')]), [
    'src/cuda/x.ts:1 -> src/link/y.ts (type-only): cuda (rank 3) must not import link (rank 6)',
    'src/ipc/x.ts:1 -> src/observe/publisher.ts: ipc reports to observe through src/observe/hooks.ts only',
  ]);
});

test('every file of src belongs to a layer', () => {
  const lost = [...graph.keys()].filter((f) => !layerOf(f));
  assert.deepEqual(lost, [], `give these files a layer in LAYERS (test/cpu/import-graph.test.ts): ${lost.join(', ')}`);
});

test('no import circle, counting type-only imports', () => {
  const circles = findCircles(graph);
  const text = circles.map((c) => {
    const inside = new Set(c.files);
    const lines = edges.filter((e) => inside.has(e.from) && inside.has(e.to)).map((e) => `    ${describeEdge(e)}`);
    return `  circle: ${c.cycle.join(' -> ')}\n  its ${c.files.length} files import each other through:\n${lines.join('\n')}`;
  });
  assert.equal(circles.length, 0, `${circles.length} import circle(s) in src:\n${text.join('\n')}`);
});

test('imports run down the layers: channel -> link -> ipc | host -> cuda -> observe -> base', () => {
  const up = layerViolations(edges.filter((e) => layerOf(e.from) && layerOf(e.to)));
  assert.deepEqual(up, [], `imports that climb the layers:\n${up.join('\n')}`);
});

/**
 * The layers inside src/link/ (and python/cuda_ipc/link/), lowest first, one folder each; index.ts
 * (the link's public surface) above them all. connect and transfers stand beside each other.
 */
const LINK_LAYERS: ReadonlyArray<{ name: string; rank: number }> = [
  // frames, frame rings, Unix and TCP byte transports, large payloads, the handshake, TCP auth, socket paths, URLs
  { name: 'transport', rank: 1 },
  // leases and GONE notices: what keeps shared memory alive across the link
  { name: 'lifetimes', rank: 2 },
  // a message's encoding and decoding, the transfer handlers' registry, the NCCL records and aborts
  { name: 'messages', rank: 3 },
  // the Link object: its options, sender, outbox, inbound reading, inbox, frame dispatch
  { name: 'connection', rank: 4 },
  // the NCCL communicators of TCP links, fanout
  { name: 'nccl', rank: 5 },
  // how host and device memory travel (each kind's handler)
  { name: 'transfers', rank: 6 },
  // spawn, listen, connect: how a link comes to be
  { name: 'connect', rank: 6 },
];

function linkLayerOf(file: string): { name: string; rank: number } | undefined {
  const m = /^(?:src|python\/cuda_ipc)\/link\/([^/]+)\//.exec(file);
  if (!m) return /^(?:src|python\/cuda_ipc)\/link\/[^/]+$/.test(file) ? { name: 'index', rank: 9 } : undefined;
  return LINK_LAYERS.find((l) => l.name === m[1]);
}

/** Edges inside a link that climb its layers (or cross between two of one rank). */
function linkLayerViolations(edges: Iterable<ImportEdge>): string[] {
  const out: string[] = [];
  for (const e of edges) {
    const from = linkLayerOf(e.from);
    const to = linkLayerOf(e.to);
    if (!from || !to || from.name === to.name) continue;
    if (to.rank >= from.rank) out.push(`${describeEdge(e)}: link/${from.name} (rank ${from.rank}) must not import link/${to.name} (rank ${to.rank})`);
  }
  return out;
}

test('every file of src/link/ is in a layer folder (or is its index.ts)', () => {
  const lost = [...graph.keys()].filter((f) => f.startsWith('src/link/') && !linkLayerOf(f));
  assert.deepEqual(lost, [], `put these files in a folder of LINK_LAYERS: ${lost.join(', ')}`);
  assert.deepEqual([...graph.keys()].filter((f) => /^src\/link\/[^/]+$/.test(f)), ['src/link/index.ts']);
});

test('inside src/link/ imports run down its layers: connect | transfers -> nccl -> connection -> messages -> lifetimes -> transport', () => {
  const planted = linkLayerViolations([
    { from: 'src/link/transport/frame.ts', to: 'src/link/connection/link.ts', typeOnly: true, dynamic: false, line: 3 },
    { from: 'src/link/connect/spawn.ts', to: 'src/link/transfers/transfer.ts', typeOnly: false, dynamic: false, line: 4 },
    { from: 'src/link/connect/spawn.ts', to: 'src/link/connection/link.ts', typeOnly: false, dynamic: false, line: 5 },
  ]);
  assert.deepEqual(planted, [
    'src/link/transport/frame.ts:3 -> src/link/connection/link.ts (type-only): link/transport (rank 1) must not import link/connection (rank 4)',
    'src/link/connect/spawn.ts:4 -> src/link/transfers/transfer.ts: link/connect (rank 6) must not import link/transfers (rank 6)',
  ]);
  const up = linkLayerViolations(edges);
  assert.deepEqual(up, [], `imports that climb the layers of src/link/:\n${up.join('\n')}`);
});

// ---- Python: python/cuda_ipc mirrors src folder for folder ----

const pyGraph = readPythonImportGraph(root);
/**
 * Every import counts, as in TypeScript: module-level, function-level and `if TYPE_CHECKING:` ones (an
 * annotation that must name something above it is a sign that an interface belongs lower down).
 */
const pyEdges = [...pyGraph.values()].flat();

/** The Python twins of LAYERS: the same names, ranks and folders (the base modules at the package top). */
const PY_LAYERS: ReadonlyArray<{ name: string; rank: number; files: RegExp }> = [
  // errors, close at collection (leak.py, as src/leak.ts), the old names' shims, and two Python-only helpers:
  // DLPack capsules and threads for long driver calls
  { name: 'base', rank: 0, files: /^python\/cuda_ipc\/(errors|_renamed|leak|parallel|dlpack)\.py$/ },
  { name: 'native', rank: 1, files: /^python\/cuda_ipc\/native\// },
  { name: 'cuda', rank: 3, files: /^python\/cuda_ipc\/cuda\// },
  { name: 'host', rank: 4, files: /^python\/cuda_ipc\/host\// },
  { name: 'ipc', rank: 4, files: /^python\/cuda_ipc\/ipc\// },
  { name: 'nccl', rank: 4, files: /^python\/cuda_ipc\/nccl\// },
  { name: 'arrays', rank: 5, files: /^python\/cuda_ipc\/arrays\// },
  { name: 'link', rank: 6, files: /^python\/cuda_ipc\/link\// },
  { name: 'channel', rank: 7, files: /^python\/cuda_ipc\/channel\// },
  { name: 'tensors', rank: 8, files: /^python\/cuda_ipc\/tensors\// },
  { name: 'api', rank: TOP_RANK + 1, files: /^python\/cuda_ipc\/__init__\.py$/ },
];

function pyLayerOf(file: string): { name: string; rank: number } | undefined {
  return PY_LAYERS.find((l) => l.files.test(file));
}

/** Python edges that climb: to a higher layer or across to another of the same rank. */
function pyLayerViolations(edges: Iterable<ImportEdge>): string[] {
  const out: string[] = [];
  for (const e of edges) {
    const from = pyLayerOf(e.from);
    const to = pyLayerOf(e.to);
    if (!from || !to || from.name === to.name) continue;
    if (to.rank >= from.rank) out.push(`${describeEdge(e)}: ${from.name} (rank ${from.rank}) must not import ${to.name} (rank ${to.rank})`);
  }
  return out;
}

test('the import graph of python/cuda_ipc was read, function-level and TYPE_CHECKING imports included', () => {
  assert.ok(pyGraph.size > 80, `only ${pyGraph.size} modules found under ${root}python/cuda_ipc`);
  assert.ok(pyEdges.length > 400, `only ${pyEdges.length} imports found`);
  assert.ok(pyEdges.some((e) => e.dynamic) && pyEdges.some((e) => e.typeOnly), 'function-level and TYPE_CHECKING imports are read');
  const link = pyGraph.get('python/cuda_ipc/link/__init__.py') ?? [];
  assert.ok(link.some((e) => e.to === 'python/cuda_ipc/link/transfers/host_bytes_transfer.py'), '`from .transfers import host_bytes_transfer as host_bytes` is an edge to the submodule');
});

test('python/cuda_ipc has the folders of src/ (the layers both languages have), no module left at its top but the base', () => {
  const folders = (dir: string): string[] => readdirSync(join(root, dir)).filter((n) => n !== '__pycache__' && statSync(join(root, dir, n)).isDirectory()).sort();
  const ts = new Set(folders('src'));
  const py = folders('python/cuda_ipc');
  assert.deepEqual(py.filter((f) => !ts.has(f)), [], 'a Python folder with no src/ twin');
  // TypeScript only: the CLI and the status record (docs/ARCHITECTURE.md says why)
  assert.deepEqual([...ts].filter((f) => !py.includes(f)), ['cli', 'observe']);
  const top = [...pyGraph.keys()].filter((f) => /^python\/cuda_ipc\/[^/]+$/.test(f)).sort();
  assert.deepEqual(top.filter((f) => !/^python\/cuda_ipc\/(__init__|errors|_renamed|leak|parallel|dlpack)\.py$/.test(f)), [], 'put these in the folder of their layer');
});

test('every module of python/cuda_ipc belongs to a layer, and of its link/ to a layer folder', () => {
  const lost = [...pyGraph.keys()].filter((f) => !pyLayerOf(f) || (f.startsWith('python/cuda_ipc/link/') && !linkLayerOf(f)));
  assert.deepEqual(lost, [], `give these modules a layer in PY_LAYERS / a folder of LINK_LAYERS: ${lost.join(', ')}`);
});

test('Python: no import circle, function-level and TYPE_CHECKING imports included', () => {
  const edge = (from: string, to: string, extra: Partial<ImportEdge>): ImportEdge => ({ from, to, typeOnly: false, dynamic: false, line: 1, ...extra });
  const planted: ImportGraph = new Map([
    ['python/cuda_ipc/tensors/update.py', [edge('python/cuda_ipc/tensors/update.py', 'python/cuda_ipc/tensors/nccl_transfer.py', { dynamic: true })]],
    ['python/cuda_ipc/tensors/nccl_transfer.py', [edge('python/cuda_ipc/tensors/nccl_transfer.py', 'python/cuda_ipc/tensors/update.py', {})]],
    ['python/cuda_ipc/link/connection/link.py', [edge('python/cuda_ipc/link/connection/link.py', 'python/cuda_ipc/link/connection/arriving.py', {})]],
    ['python/cuda_ipc/link/connection/arriving.py', [edge('python/cuda_ipc/link/connection/arriving.py', 'python/cuda_ipc/link/connection/link.py', { typeOnly: true })]],
  ]);
  assert.equal(findCircles(planted).length, 2, 'a function-level import and a TYPE_CHECKING import closing a circle are found');
  const circles = findCircles(pyGraph);
  const text = circles.map((c) => {
    const inside = new Set(c.files);
    return `  circle: ${c.cycle.join(' -> ')}\n${pyEdges.filter((e) => inside.has(e.from) && inside.has(e.to)).map((e) => `    ${describeEdge(e)}`).join('\n')}`;
  });
  assert.equal(circles.length, 0, `${circles.length} import circle(s) in python/cuda_ipc:\n${text.join('\n')}`);
});

test('Python: imports run down the same layers as TypeScript, and inside link/ down its layers', () => {
  assert.deepEqual(pyLayerViolations([
    { from: 'python/cuda_ipc/cuda/stream.py', to: 'python/cuda_ipc/tensors/kernels.py', typeOnly: false, dynamic: false, line: 13 },
    { from: 'python/cuda_ipc/ipc/event.py', to: 'python/cuda_ipc/link/lifetimes/lease.py', typeOnly: true, dynamic: false, line: 15 },
    { from: 'python/cuda_ipc/ipc/pool.py', to: 'python/cuda_ipc/host/host_buffer.py', typeOnly: false, dynamic: true, line: 9 },
  ]), [
    'python/cuda_ipc/cuda/stream.py:13 -> python/cuda_ipc/tensors/kernels.py: cuda (rank 3) must not import tensors (rank 8)',
    'python/cuda_ipc/ipc/event.py:15 -> python/cuda_ipc/link/lifetimes/lease.py (TYPE_CHECKING): ipc (rank 4) must not import link (rank 6)',
    'python/cuda_ipc/ipc/pool.py:9 -> python/cuda_ipc/host/host_buffer.py (function-level): ipc (rank 4) must not import host (rank 4)',
  ]);
  const out = [...pyLayerViolations(pyEdges), ...linkLayerViolations(pyEdges)];
  assert.deepEqual(out, [], `imports that climb the layers of python/cuda_ipc:\n${out.join('\n')}`);
});

test('no file over 600 lines in src, python and native (split by job, as slot_ring.py and ring_recovery.py)', () => {
  const over: string[] = [];
  let seen = 0;
  const walk = (dir: string): void => {
    for (const name of readdirSync(join(root, dir)).sort()) {
      const p = `${dir}/${name}`;
      if (name === '__pycache__' || name === 'node_modules') continue;
      if (statSync(join(root, p)).isDirectory()) walk(p);
      else if (/\.(ts|py|pyi|c|cc|h)$/.test(name)) {
        seen++;
        const lines = readFileSync(join(root, p), 'utf8').split('\n').length - 1;
        if (lines > 600) over.push(`${p}: ${lines} lines`);
      }
    }
  };
  for (const dir of ['src', 'python', 'native']) walk(dir);
  assert.ok(seen > 250, `only ${seen} files read`);
  assert.deepEqual(over, [], `files over 600 lines: split each by job:\n${over.join('\n')}`);
});
