// Refused connections, counted and reported coalesced (both listeners' 'refused' event): a flood of
// connections that fail or go past a bound costs O(1) each (a counter; no error object, no event),
// and the application hears of them at most once per interval. The first refusal after a quiet
// interval is reported at once, so a single wrong token is heard as it happens.
import { IpcError } from '../../errors.js';

/** How many addresses (or uids) a report names one by one; the rest are summed in `otherSources`. */
export const REPORT_SOURCES = 16;
/** The default interval between two 'refused' reports, in ms. */
export const REFUSED_INTERVAL_MS = 1000;

/**
 * What a 'refused' event covers beside its first error: every connection the listener refused
 * since the previous report (at least one), counted by reason and by where it came from.
 */
export interface RefusedReport {
  /** Connections refused that this report covers (the first error's included); at least 1. */
  count: number;
  /** The counts by error code (ERR_AUTH_FAILED, ERR_FRAME_INVALID, ERR_TIMEOUT, ERR_LIMIT_REACHED, ...). */
  byCode: Record<string, number>;
  /**
   * The counts by source: a TCP listener's remote address (IPv4, or IPv6), a Unix listener's
   * `uid N`; at most 16 sources, those seen first; the rest are counted in `otherSources`.
   */
  bySource: Record<string, number>;
  /** Refusals from sources past the 16 named. */
  otherSources: number;
  /** When the first and the last refusal this report covers happened (Date.now()). */
  first: number;
  last: number;
}

interface Batch {
  error: IpcError;
  report: RefusedReport;
}

/**
 * Counts refusals and emits them through `emit(error, report)`: at once when no report went out
 * within the last `intervalMs`, else gathered into one report at the end of that interval.
 * `flush()` (a listener's close) reports what is gathered at once.
 */
export class RefusalReporter {
  readonly #emit: (error: IpcError, report: RefusedReport) => void;
  readonly #intervalMs: number;
  #batch: Batch | undefined;
  #lastEmit = -Infinity;
  #timer: NodeJS.Timeout | undefined;
  /** Every refusal so far, reported or not. */
  total = 0;

  constructor(intervalMs: number, emit: (error: IpcError, report: RefusedReport) => void) {
    this.#intervalMs = intervalMs;
    this.#emit = emit;
  }

  /**
   * Notes one refusal of `code` from `source`; `error` makes its IpcError, called only for the
   * first refusal of a report (the others are only counted).
   */
  note(code: string, source: string, error: () => IpcError): void {
    this.total++;
    const now = Date.now();
    let b = this.#batch;
    if (!b) {
      b = this.#batch = {
        error: error(),
        report: { count: 0, byCode: {}, bySource: {}, otherSources: 0, first: now, last: now },
      };
    }
    const r = b.report;
    r.count++;
    r.last = now;
    r.byCode[code] = (r.byCode[code] ?? 0) + 1;
    if (r.bySource[source] !== undefined) r.bySource[source]++;
    else if (Object.keys(r.bySource).length < REPORT_SOURCES) r.bySource[source] = 1;
    else r.otherSources++;
    const wait = this.#lastEmit + this.#intervalMs - now;
    if (wait <= 0) this.flush();
    else this.#timer ??= setTimeout(() => this.flush(), wait).unref();
  }

  /** Reports what is gathered now (nothing when nothing is). */
  flush(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const b = this.#batch;
    if (!b) return;
    this.#batch = undefined;
    this.#lastEmit = Date.now();
    this.#emit(b.error, b.report);
  }

  /** Drops what is gathered without reporting it, and stops the timer. */
  stop(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#batch = undefined;
  }
}
