// What the CLI prints for a listener's 'refused' event (coalesced: the first refusal and the counts
// of the others since the previous report), and whether it ends the producer: a peer that spoke the
// protocol with another token is the mistake of the two-terminal example, so both sides fail.
import type { IpcError } from '../errors.js';
import type { RefusedReport } from '../link/connect/refusal-report.js';
import { terminalSafe } from './terminal-text.js';

/** One line for `error` and `report`: who and why, then the others counted by code and source. */
export function refusedLine(error: IpcError, report: RefusedReport): string {
  let line = `refused a connection: [${error.code}] ${error.message}`;
  if (report.count > 1) {
    const codes = Object.entries(report.byCode).map(([code, n]) => `${code} ${n}`).join(', ');
    const sources = Object.entries(report.bySource).map(([source, n]) => `${source} ${n}`).join(', ');
    const others = report.otherSources > 0 ? `, ${report.otherSources} from other addresses` : '';
    line += `; with it ${report.count} refused since the last report (${codes}; from ${sources}${others})`;
  }
  return terminalSafe(line);
}

/** Whether the report holds a peer that proved another token (ERR_AUTH_FAILED): the producer then fails. */
export function wrongToken(report: RefusedReport): boolean {
  return (report.byCode['ERR_AUTH_FAILED'] ?? 0) > 0;
}
