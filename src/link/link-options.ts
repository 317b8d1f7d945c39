// The bounds a link puts on what one peer can make it hold, given to spawn(), connect(), listen()
// and parentLink(), checked once when the link is made.
import { constants as bufferConstants } from 'node:buffer';
import { checkObject, optionalInteger } from '../arg-errors.js';
import { DEFAULT_MAX_MESSAGE_BYTES } from './large-message.js';

export interface LinkOptions {
  /**
   * The largest message, in payload bytes, this link sends or accepts (default 1 GiB). Messages
   * larger than a frame (128 KiB) travel in a sealed memfd. A send over it throws
   * ERR_MESSAGE_TOO_LARGE; a peer that sends more gets the link closed (ERR_MESSAGE_TOO_LARGE).
   */
  maxMessageBytes?: number;
}

/** LinkOptions with every default filled in. */
export interface LinkLimits {
  readonly maxMessageBytes: number;
}

export const DEFAULT_LINK_LIMITS: LinkLimits = {
  maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
};

/** Checks `options` (TypeError / RangeError with Node's codes) and fills in the defaults. */
export function linkLimits(options: LinkOptions | undefined, what: string): LinkLimits {
  const o = checkObject<LinkOptions>(options, what);
  if (!o) return DEFAULT_LINK_LIMITS;
  return {
    // At most what one Buffer can hold: a received large message is read into one.
    maxMessageBytes: optionalInteger(o.maxMessageBytes, `${what}.maxMessageBytes`, DEFAULT_MAX_MESSAGE_BYTES, 1, bufferConstants.MAX_LENGTH),
  };
}
