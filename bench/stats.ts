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

/** One-way and work-sharing runs: messages before this long are not timed (the children's code
 * compiled, the adaptive spin settled, the slots' pages touched). */
export const ONE_WAY_WARMUP_MS = 200;

/** Round-trip runs: untimed until both their warm-up count and this long passed, then timed until
 * both their count and ROUND_TRIP_TIMED_MS passed. A count alone (2,000 after 2,000, about 12 ms at
 * 6 us) timed code the JIT had not finished compiling, in a fresh child each run: on a 2-core
 * development machine the spin round trip took 6.0 us in the bench against 3.5-3.9 us over
 * 200,000 rounds. */
export const ROUND_TRIP_WARMUP_MS = 300;
export const ROUND_TRIP_TIMED_MS = 300;

/** The schedule of a round-trip loop (above): call next() before each round; 'warm' (untimed),
 * 'first' (the first timed round: start counting CPU there), 'timed', or 'done'. */
export class RoundSchedule {
  readonly #warmup: number;
  readonly #count: number;
  readonly #timedMs: number;
  readonly #warmUntil: number;
  #round = 0;
  #timedFrom = -1;
  #timedUntil = 0;

  constructor(warmup: number, count: number, warmMs = ROUND_TRIP_WARMUP_MS, timedMs = ROUND_TRIP_TIMED_MS) {
    this.#warmup = warmup;
    this.#count = count;
    this.#timedMs = timedMs;
    this.#warmUntil = performance.now() + warmMs;
  }

  next(): 'warm' | 'first' | 'timed' | 'done' {
    const i = this.#round++;
    // The clock is read every 64 rounds only: a read costs a good part of a spin round trip's code.
    const look = i % 64 === 0;
    if (this.#timedFrom < 0) {
      if (i < this.#warmup || !look || performance.now() < this.#warmUntil) return 'warm';
      this.#timedFrom = i;
      this.#timedUntil = performance.now() + this.#timedMs;
      return 'first';
    }
    if (i - this.#timedFrom >= this.#count && look && performance.now() >= this.#timedUntil) {
      this.#round--;
      return 'done';
    }
    return 'timed';
  }
}

// ---------------------------------------------------------------------------------------------
// Whether a row's figure decides (issue 38): a row runs several times; the spread of its runs'
// medians, (max - min) / median, says how far one run's figure can be trusted. A target checked on
// a row whose spread is over SPREAD_LIMIT (or on a single run, whose spread is unknown) is
// UNDECIDED, not MET or MISSED: the same code gave figures on both sides of the line.

/** The widest spread of a row's runs that still decides a target. */
export const SPREAD_LIMIT = 0.15;

/** One row's runs: each run's median, and their spread, (max - min) / median of the medians
 * (NaN with fewer than two runs: unknown). */
export interface Spread { medians: number[]; spread: number }

export function spreadOf(medians: readonly number[]): Spread {
  const finite = medians.filter((v) => Number.isFinite(v));
  const m = summarize(finite).median;
  const spread = finite.length < 2 || finite.length < medians.length ? NaN : m > 0 ? (Math.max(...finite) - Math.min(...finite)) / m : NaN;
  return { medians: [...medians], spread };
}

/** The wider of several rows' spreads (a target that compares two rows depends on both); NaN
 * when any is unknown. */
export function widest(...spreads: ReadonlyArray<Spread | undefined>): number {
  let w = 0;
  for (const s of spreads) {
    if (!s || !(s.spread >= 0)) return NaN;
    w = Math.max(w, s.spread);
  }
  return w;
}

export type Verdict = 'MET' | 'MISSED' | 'UNDECIDED';

/** MET / MISSED when the runs agree (spread <= limit), else UNDECIDED. */
export function verdict(met: boolean, spread: number, limit = SPREAD_LIMIT): Verdict {
  if (!(spread >= 0) || spread > limit) return 'UNDECIDED';
  return met ? 'MET' : 'MISSED';
}

/** A checked target, as the JSON keeps it. */
export interface TargetResult { row: string; target: string; value: number; limit: number; spread: number; verdict: Verdict }

/** "spread 12%" / "spread 31% > 15%" / "spread unknown (one run)". */
export function spreadText(spread: number, limit = SPREAD_LIMIT): string {
  if (!(spread >= 0)) return 'spread unknown (one run)';
  return `spread ${(spread * 100).toFixed(0)}%${spread > limit ? ` > ${(limit * 100).toFixed(0)}%` : ''}`;
}

/** Measurements that each run gives with a summary (or without one: skipped), kept by name over
 * the runs of a bench part. */
export class RunsByName<T extends { name: string; summary?: Summary }> {
  readonly #byName = new Map<string, { last: T; runs: Summary[]; skipped?: T }>();

  /** One run's measurement. */
  add(m: T): void {
    const e = this.#byName.get(m.name) ?? { last: m, runs: [] };
    e.last = m;
    if (m.summary) e.runs.push(m.summary);
    else e.skipped ??= m;
    this.#byName.set(m.name, e);
  }

  /** Each run's summary of the measurement `name`. */
  runs(name: string): Summary[] {
    return this.#byName.get(name)?.runs ?? [];
  }

  /** The spread of `name`'s runs; undefined where a run skipped it or none measured it. */
  spread(name: string): Spread | undefined {
    const e = this.#byName.get(name);
    return !e || e.skipped || e.runs.length === 0 ? undefined : spreadOf(e.runs.map((r) => r.median));
  }

  /** Every measured name with its spread, the name after `prefix` (as a table names it). */
  spreads(prefix = ''): Array<[string, Spread]> {
    return [...this.#byName.keys()].flatMap((name) => {
      const s = this.spread(name);
      return s ? [[prefix + name, s] as [string, Spread]] : [];
    });
  }

  /** Each measurement in the order first seen: the last run's, its summary combined over the runs
   * (combineRuns) and their spread; one that a run skipped, as that run gave it (no spread). */
  combined(): Array<{ m: T; spread?: Spread }> {
    return [...this.#byName.values()].map(({ last, runs, skipped }) => {
      if (skipped || runs.length === 0) return { m: skipped ?? last };
      const c = combineRuns(runs);
      return { m: { ...last, summary: c.summary }, spread: c.spread };
    });
  }
}

export const fmtRate = (v: number) => (v >= 1e9 ? `${(v / 1e9).toFixed(1)} G` : v >= 1e6 ? `${(v / 1e6).toFixed(2)} M` : `${(v / 1e3).toFixed(0)} k`);
const fmtNum = (v: number) => (v >= 10_000 ? fmtRate(v) : v >= 100 ? v.toFixed(0) : v.toFixed(1));

/** Each run's median and their spread (every row with runs). */
const spreadNote = (x: Spread) => (x.medians.length > 0 ? `runs ${x.medians.map((v) => fmtNum(v)).join(' / ')}, ${spreadText(x.spread)}` : '');

/** `notes` with the runs' note (spreadNote) at the end. */
export function withSpread(notes: string[], x: Spread): string[] {
  const n = spreadNote(x);
  if (n) notes.push(n);
  return notes;
}

/** One row's figure over several runs, each summarized on its own (a run of the C reference or a
 * Python one reports only its summary): the median of the runs' medians and of their p99s, every
 * sample counted; the spread of the medians. */
export function combineRuns(runs: readonly Summary[]): { summary: Summary; spread: Spread } {
  const med = (xs: number[]) => summarize(xs).median;
  return {
    summary: { n: runs.reduce((a, r) => a + r.n, 0), median: med(runs.map((r) => r.median)), p99: med(runs.map((r) => r.p99)), mean: runs.reduce((a, r) => a + r.mean, 0) / Math.max(1, runs.length) },
    spread: spreadOf(runs.map((r) => r.median)),
  };
}

/**
 * The order of the rows in round `round` of `rounds` (0-based; round -1 and below: warm-up rounds,
 * in plain order): each round starts `rows / rounds` rows further on, so that one row's runs are
 * spread evenly over the bench (never back to back, as long as there are two rows or more) and
 * follow different rows.
 */
export function roundOrder(rows: number, round: number, rounds: number): number[] {
  const shift = shiftOf(rows, round, rounds);
  return Array.from({ length: rows }, (_, i) => (i + shift) % rows);
}

function shiftOf(rows: number, round: number, rounds: number): number {
  if (round <= 0 || rows < 2) return 0;
  const before = shiftOf(rows, round - 1, rounds);
  let shift = Math.floor((round * rows) / Math.max(1, rounds)) % rows;
  // The last row of the round before must not open this one (its two runs back to back).
  if (shift === (before + rows - 1) % rows) shift = (shift + 1) % rows;
  return shift;
}
