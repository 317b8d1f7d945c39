// The README's TypeScript examples as programs, so that tests can type-check them (all) and run
// them (the CPU ones) exactly as written.
//
// Fences: ```ts cpu NAME (type-checked and run everywhere), ```ts gpu NAME (type-checked
// everywhere, run where there is a GPU; `ts gpu NAME two-gpus` where there are two) or ```ts
// fragment NAME (a piece of a larger program: type-checked everywhere, never run). Blocks with
// the same NAME are the files of one program, named by their first line (`// parent.ts`; else
// main.ts); the first file is the one run. A ```python gpu NAME block adds a Python file
// (`# worker.py`) to a program. ```text output NAME holds what the program prints. A fragment
// that is not a whole program may be preceded by an HTML comment `<!-- ts-context: declarations
// -->`, prepended to it for type-checking only.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface ReadmeFile {
  readonly name: string;
  readonly text: string;
}

export interface ReadmeProgram {
  readonly name: string;
  readonly kind: 'cpu' | 'gpu' | 'fragment';
  /** README line of the program's first block. */
  readonly line: number;
  readonly files: ReadmeFile[];
  /** What it prints (stdout), from a ```text output NAME block. */
  expectedOutput?: string;
  /** A GPU program that needs two GPUs to run. */
  twoGpus?: boolean;
}

export interface ReadmeExamples {
  readonly programs: ReadmeProgram[];
  /** Blocks the convention cannot place (untagged TypeScript, a duplicate file name, ...). */
  readonly problems: string[];
}

export function readmeExamples(path: string): ReadmeExamples {
  const lines = readFileSync(path, 'utf8').split('\n');
  const programs = new Map<string, ReadmeProgram>();
  const outputs = new Map<string, { line: number; text: string }>();
  const problems: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*(.*)$/.exec(lines[i]!);
    if (!open) continue;
    const start = i + 1;
    let end = start;
    while (end < lines.length && !/^```\s*$/.test(lines[end]!)) end++;
    const body = lines.slice(start, end).join('\n') + '\n';
    const [lang, info] = [open[1]!, open[2]!.trim().split(/\s+/).filter(Boolean)];
    i = end;
    if (lang === 'text' && info[0] === 'output' && info[1]) {
      outputs.set(info[1], { line: start, text: body });
      continue;
    }
    const python = lang === 'python' && (info[0] === 'cpu' || info[0] === 'gpu');
    if (lang !== 'ts' && lang !== 'typescript' && !python) continue;
    const [kind, name] = info;
    if ((kind !== 'cpu' && kind !== 'gpu' && kind !== 'fragment') || !name) {
      problems.push(`README line ${start}: a TypeScript block must be tagged \`ts cpu NAME\`, \`ts gpu NAME\` or \`ts fragment NAME\` (got \`${open[0]}\`)`);
      continue;
    }
    const context = /^<!--\s*ts-context:\s*([\s\S]*?)\s*-->\s*$/.exec(lines[start - 2] ?? '')?.[1];
    const file = python ? /^# ([\w.-]+\.py)\b/.exec(body)?.[1] ?? 'main.py' : /^\/\/ ([\w.-]+\.ts)\b/.exec(body)?.[1] ?? 'main.ts';
    let program = programs.get(name);
    if (!program) {
      program = { name, kind, line: start, files: [] };
      programs.set(name, program);
      if (python) problems.push(`README line ${start}: program '${name}' starts with a Python block; its TypeScript entry comes first`);
    } else if (program.kind !== kind) {
      problems.push(`README line ${start}: program '${name}' mixes cpu and gpu blocks`);
    }
    if (program.files.some((f) => f.name === file)) {
      problems.push(`README line ${start}: program '${name}' has two files named ${file}; name each block with a first line such as // child.ts`);
      continue;
    }
    program.files.push({ name: file, text: context ? `${context}\n${body}` : body });
    if (info.includes('two-gpus')) program.twoGpus = true;
  }
  for (const [name, out] of outputs) {
    const program = programs.get(name);
    if (!program) problems.push(`README line ${out.line}: output of '${name}', which no TypeScript block names`);
    else program.expectedOutput = out.text;
  }
  return { programs: [...programs.values()], problems };
}

/** Writes each program into `dir/<name>/`, and returns the path of each program's entry (as .js). */
export function writePrograms(dir: string, programs: readonly ReadmeProgram[]): Map<ReadmeProgram, string> {
  const entries = new Map<ReadmeProgram, string>();
  for (const p of programs) {
    const d = join(dir, p.name);
    mkdirSync(d, { recursive: true });
    for (const f of p.files) writeFileSync(join(d, f.name), f.text);
    entries.set(p, join(d, p.files[0]!.name.replace(/\.ts$/, '.js')));
  }
  return entries;
}

/** The settings a new user's `tsc --init` wrote (JSON with comments), made strict and set to check libraries. */
export function strictUserTsconfig(initText: string, overrides: Record<string, unknown> = {}): string {
  let text = initText.replace(/"skipLibCheck":\s*true/, '"skipLibCheck": false');
  if (!/"skipLibCheck"/.test(text)) text = text.replace(/"compilerOptions":\s*\{/, '"compilerOptions": {\n    "skipLibCheck": false,');
  if (!/"strict":\s*true/.test(text)) text = text.replace(/"compilerOptions":\s*\{/, '"compilerOptions": {\n    "strict": true,');
  for (const [key, value] of Object.entries(overrides)) {
    const re = new RegExp(`(^|\\n)(\\s*)(//\\s*)?"${key}":[^\\n]*`);
    const line = `"${key}": ${JSON.stringify(value)},`;
    text = re.test(text) ? text.replace(re, `$1$2${line}`) : text.replace(/"compilerOptions":\s*\{/, `"compilerOptions": {\n    ${line}`);
  }
  return text;
}
