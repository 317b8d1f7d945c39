// The planner's typed errors: each names the tensor (a global tensor or a rank's local one), the
// rank whose layout showed it, and the range in question, so that a group can say which layout to
// fix before anything moves.
import { IpcError, type IpcErrorCode } from '../../errors.js';

/** The codes of LayoutError. */
export type LayoutErrorCode = Extract<IpcErrorCode, `ERR_LAYOUT_${string}`>;
/** A box: start and length per dimension. */
export interface Box {
  readonly start: readonly number[];
  readonly length: readonly number[];
}

/** What a LayoutError points at. */
export interface LayoutErrorDetail {
  /** The tensor: a global tensor's name, or a rank's local tensor (`param` for destinations). */
  tensor?: string;
  /** The rank whose layout showed the problem. */
  rank?: number;
  /** The range in question (global coordinates of `tensor`, or a local tensor's own coordinates). */
  range?: Box;
}

/** A layout or plan refused before anything moved; `code` says why, the fields say where. */
export class LayoutError extends IpcError {
  override name = 'LayoutError';
  readonly tensor?: string;
  readonly rank?: number;
  readonly range?: Box;
  constructor(code: LayoutErrorCode, message: string, detail: LayoutErrorDetail = {}) {
    super(code, message);
    if (detail.tensor !== undefined) this.tensor = detail.tensor;
    if (detail.rank !== undefined) this.rank = detail.rank;
    if (detail.range !== undefined) this.range = { start: [...detail.range.start], length: [...detail.range.length] };
  }
}

/** A range as messages print it: `[0:4, 8:16]` (start:end per dimension). */
export function formatRange(box: Box): string {
  return `[${box.start.map((s, i) => `${s}:${s + box.length[i]!}`).join(', ')}]`;
}
