// Imports run one way, down the layers (LAYERS below; docs/ARCHITECTURE.md draws them), and never
// in a circle: a newcomer can read any folder knowing only the ones below it, and module
// initialisation order never depends on who was imported first. Type-only imports count as edges
// like any other: a type that must name something above it is a sign that an interface belongs
// lower down.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describeEdge, findCircles, readImportGraph, type ImportEdge, type ImportGraph } from '../helpers/import-graph.js';

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
  { name: 'base', rank: 0, files: /^src\/(errors|arg-errors|abort|leak|half-float|runtime-directory|safe-files)\.ts$/ },
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
