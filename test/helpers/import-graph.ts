// The import graph of src/*.ts, read from the sources (not the compiled JavaScript, where
// `import type` has vanished): every import, `export ... from`, side-effect import and import()
// naming a relative path, type-only ones included. Used by test/cpu/import-graph.test.ts, which
// fails on any circle and on any import that climbs the layers of shared/DESIGN.md.
//
// Statements are found with a few regular expressions, not a parser: an import or export
// statement starts a line (as every one in src does), which keeps text in strings and comments
// out; import() may stand anywhere but in a comment. No dependency needed.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

export interface ImportEdge {
  /** Files as paths relative to the scanned root's parent, e.g. 'src/link/connection/link.ts'. */
  from: string;
  to: string;
  /** `import type`, `export type`, or braces holding only `type X` names. */
  typeOnly: boolean;
  /** import('...'), in code or in a type. */
  dynamic: boolean;
  /** 1-based line of the statement, for messages. */
  line: number;
}

export type ImportGraph = Map<string, ImportEdge[]>;

// `import ... from '...'` / `export ... from '...'`, possibly over several lines: from the keyword
// at the start of a line to the first `from '...'` with no `;` between.
const FROM_RE = /^(import|export)\b([^;]*?)\bfrom\s*(['"])([^'"\n]+)\3/gm;
const SIDE_EFFECT_RE = /^import\s*(['"])([^'"\n]+)\1/gm;
const DYNAMIC_RE = /\bimport\(\s*(['"])([^'"\n]+)\1\s*\)/g;

function lineAt(text: string, index: number): number {
  let n = 1;
  for (let i = text.indexOf('\n'); i !== -1 && i < index; i = text.indexOf('\n', i + 1)) n++;
  return n;
}

function inComment(text: string, index: number): boolean {
  const start = text.lastIndexOf('\n', index - 1) + 1;
  return /^\s*(\/\/|\/\*|\*)/.test(text.slice(start, index));
}

/** Whether the clause between `import`/`export` and `from` names only types. */
function typeOnlyClause(clause: string): boolean {
  const c = clause.trim();
  if (/^type\b/.test(c)) return true;
  const braces = /^\{([\s\S]*)\}$/.exec(c);
  if (!braces) return false; // a default or namespace import, or `export *`
  const names = braces[1]!.split(',').map((s) => s.trim()).filter(Boolean);
  return names.length > 0 && names.every((n) => /^type\s/.test(n));
}

function listSources(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) listSources(p, out);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/**
 * Reads every .ts file below `root/dir` (default src) and returns its imports of other files
 * there. Specifiers that are not relative (node:fs, packages) or leave the folder are not edges.
 */
export function readImportGraph(root: string, dir = 'src'): ImportGraph {
  const graph: ImportGraph = new Map();
  const base = join(root, dir);
  const key = (file: string): string => relative(root, file).split('\\').join('/');
  for (const file of listSources(base)) {
    const text = readFileSync(file, 'utf8');
    const edges: ImportEdge[] = [];
    const add = (spec: string, index: number, typeOnly: boolean, dynamic: boolean): void => {
      if (!spec.startsWith('.')) return;
      const target = join(dirname(file), spec.replace(/\.js$/, '.ts'));
      if (!existsSync(target) || !key(target).startsWith(`${dir}/`)) return;
      edges.push({ from: key(file), to: key(target), typeOnly, dynamic, line: lineAt(text, index) });
    };
    for (const m of text.matchAll(FROM_RE)) add(m[4]!, m.index!, typeOnlyClause(m[2]!), false);
    for (const m of text.matchAll(SIDE_EFFECT_RE)) add(m[2]!, m.index!, false, false);
    for (const m of text.matchAll(DYNAMIC_RE)) if (!inComment(text, m.index!)) add(m[2]!, m.index!, false, true);
    graph.set(key(file), edges);
  }
  return graph;
}

/** Files that import each other round a circle. */
export interface Circle {
  /** Every file of the strongly connected component, sorted. */
  files: string[];
  /** A shortest circle through the first of them, e.g. ['a.ts', 'b.ts', 'a.ts']. */
  cycle: string[];
}

/**
 * The circles of the graph: one per strongly connected component of more than one file (or a file
 * importing itself). Empty when the imports run one way.
 */
export function findCircles(graph: ImportGraph): Circle[] {
  const next = (f: string): string[] => [...new Set((graph.get(f) ?? []).map((e) => e.to))].sort();
  // Tarjan's strongly connected components, iteratively (no recursion limit to meet).
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  for (const start of [...graph.keys()].sort()) {
    if (index.has(start)) continue;
    const work: Array<{ file: string; edges: string[]; at: number }> = [];
    const open = (f: string): void => {
      index.set(f, counter);
      low.set(f, counter++);
      stack.push(f);
      onStack.add(f);
      work.push({ file: f, edges: next(f), at: 0 });
    };
    open(start);
    while (work.length) {
      const top = work[work.length - 1]!;
      if (top.at < top.edges.length) {
        const to = top.edges[top.at++]!;
        if (!index.has(to)) open(to);
        else if (onStack.has(to)) low.set(top.file, Math.min(low.get(top.file)!, index.get(to)!));
        continue;
      }
      work.pop();
      if (work.length) {
        const parent = work[work.length - 1]!.file;
        low.set(parent, Math.min(low.get(parent)!, low.get(top.file)!));
      }
      if (low.get(top.file) === index.get(top.file)) {
        const component: string[] = [];
        let f: string;
        do {
          f = stack.pop()!;
          onStack.delete(f);
          component.push(f);
        } while (f !== top.file);
        if (component.length > 1 || next(top.file).includes(top.file)) components.push(component.sort());
      }
    }
  }
  return components.map((component) => {
    const members = new Set(component);
    const first = component[0]!;
    // Breadth-first from `first` back to itself, inside the component.
    const cameFrom = new Map<string, string>();
    const queue = [first];
    for (let i = 0; i < queue.length; i++) {
      for (const to of next(queue[i]!)) {
        if (!members.has(to)) continue;
        if (to === first) {
          const path = [first];
          for (let at: string | undefined = queue[i]; at !== undefined && at !== first; at = cameFrom.get(at)) path.push(at);
          return { files: component, cycle: [first, ...path.slice(1).reverse(), first] };
        }
        if (!cameFrom.has(to)) {
          cameFrom.set(to, queue[i]!);
          queue.push(to);
        }
      }
    }
    return { files: component, cycle: [first, first] };
  });
}

function listPython(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) {
      if (name !== '__pycache__') listPython(p, out);
    } else if (name.endsWith('.py')) out.push(p);
  }
  return out;
}

const PY_FROM_RE = /^([ \t]*)from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)/;
const PY_IMPORT_RE = /^([ \t]*)import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)/;

/**
 * The import graph of a Python package (default python/cuda_ipc), keyed like readImportGraph's
 * ('python/cuda_ipc/link/connection/link.py'): every `from X import a, b` and `import X` naming a
 * module of the package, relative or absolute, at module level or inside a function (`dynamic`:
 * it runs when the function does, a circle all the same). Imports under `if TYPE_CHECKING:` never
 * run; they are `typeOnly`. `from pkg import name` is an edge to the submodule pkg.name where there
 * is one, else to pkg/__init__.py. Read line by line (docstrings skipped), no parser needed.
 */
export function readPythonImportGraph(root: string, dir = 'python/cuda_ipc'): ImportGraph {
  const graph: ImportGraph = new Map();
  const base = join(root, dir);
  const top = dir.split('/').pop()!; // cuda_ipc
  const prefix = dir.split('/').slice(0, -1).join('/'); // python
  const moduleFile = (dotted: string): string | undefined => {
    const rel = join(prefix, ...dotted.split('.'));
    for (const f of [`${rel}.py`, join(rel, '__init__.py')]) if (existsSync(join(root, f))) return f.split('\\').join('/');
    return undefined;
  };
  for (const file of listPython(base)) {
    const key = relative(root, file).split('\\').join('/');
    const parts = key.slice(prefix.length + 1, -3).split('/');
    const pkg = parts.at(-1) === '__init__' ? parts.slice(0, -1) : parts.slice(0, -1);
    const lines = readFileSync(file, 'utf8').split('\n');
    const edges: ImportEdge[] = [];
    let inString: string | undefined;
    let typeBlock: number | undefined; // indentation of an `if TYPE_CHECKING:` being read
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i]!;
      const indent = /^[ \t]*/.exec(line)![0].length;
      if (inString === undefined && line.trim() !== '' && typeBlock !== undefined && indent <= typeBlock) typeBlock = undefined;
      const wasString = inString !== undefined;
      for (const q of line.match(/"""|\'\'\'/g) ?? []) inString = inString === undefined ? q : inString === q ? undefined : inString;
      if (wasString || line.trimStart().startsWith('"""') || line.trimStart().startsWith("\'\'\'")) continue;
      if (/^[ \t]*if[ \t]+(typing\.)?TYPE_CHECKING[ \t]*:/.test(line)) { typeBlock = indent; continue; }
      const typeOnly = typeBlock !== undefined;
      const dynamic = indent > 0 && !typeOnly;
      const add = (dotted: string): void => {
        const to = moduleFile(dotted);
        if (to && !edges.some((e) => e.to === to && e.line === i + 1)) edges.push({ from: key, to, typeOnly, dynamic, line: i + 1 });
      };
      let m = PY_FROM_RE.exec(line);
      if (m) {
        let names = m[3]!;
        if (names.startsWith('(') && !names.includes(')')) {
          for (let j = i + 1; j < lines.length && !names.includes(')'); j++) names += ` ${lines[j]}`;
        }
        const spec = m[2]!;
        const dots = /^\.*/.exec(spec)![0].length;
        const rest = spec.slice(dots);
        let mod: string;
        if (dots > 0) {
          const up = pkg.slice(0, pkg.length - (dots - 1));
          mod = [...up, ...(rest ? [rest] : [])].join('.');
        } else if (rest === top || rest.startsWith(`${top}.`)) mod = rest;
        else continue;
        for (const n of names.replace(/[()]/g, '').split(',').map((x) => x.trim().split(/\s+/)[0]!).filter((x) => /^\w+$/.test(x))) {
          if (moduleFile(`${mod}.${n}`)) add(`${mod}.${n}`);
          else add(mod);
        }
        continue;
      }
      m = PY_IMPORT_RE.exec(line);
      if (m) for (const n of m[2]!.split(',').map((x) => x.trim().split(/\s+/)[0]!)) if (n === top || n.startsWith(`${top}.`)) add(n);
    }
    graph.set(key, edges);
  }
  return graph;
}

/** Formats an edge for a message: `src/a.ts:12 -> src/b.ts (type-only)`. */
export function describeEdge(e: ImportEdge): string {
  const py = e.from.endsWith('.py');
  const notes = [e.typeOnly ? (py ? 'TYPE_CHECKING' : 'type-only') : '', e.dynamic ? (py ? 'function-level' : 'import()') : ''].filter(Boolean);
  return `${e.from}:${e.line} -> ${e.to}${notes.length ? ` (${notes.join(', ')})` : ''}`;
}
