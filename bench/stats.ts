// Summaries and the printed table of the benchmarks.
export interface Summary { n: number; median: number; p99: number; mean: number }

export function summarize(samples: ArrayLike<number>): Summary {
  const s = Float64Array.from(samples).sort();
  const n = s.length;
  let sum = 0;
  for (const v of s) sum += v;
  return { n, median: n ? (n % 2 ? s[n >> 1]! : (s[n / 2 - 1]! + s[n / 2]!) / 2) : NaN, p99: n ? s[Math.min(n - 1, Math.ceil(n * 0.99) - 1)]! : NaN, mean: sum / n };
}

export interface Row {
  name: string;
  unit: string;
  median: number;
  p99?: number;
  n?: number;
  /** e.g. 'target <= 30 us: MET' or 'vs CuPy: 0.25x' */
  notes?: string[];
}

export function printTable(title: string, rows: readonly Row[]): void {
  const fmt = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? '-' : v >= 100 ? v.toFixed(0) : v.toFixed(1));
  const cells = rows.map((r) => [r.name, `${fmt(r.median)} ${r.unit}`, r.p99 === undefined ? '-' : `${fmt(r.p99)} ${r.unit}`, r.n === undefined ? '-' : String(r.n), (r.notes ?? []).join('; ')]);
  const head = ['benchmark', 'median', 'p99', 'n', 'comparison'];
  const widths = head.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: string[]) => '| ' + c.map((v, i) => v.padEnd(widths[i]!)).join(' | ') + ' |';
  console.log(`\n${title}`);
  console.log(line(head));
  console.log('|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|');
  for (const c of cells) console.log(line(c));
}
