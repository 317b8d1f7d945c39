// The addresses of links between machines (PROTOCOL.md 2.3): `tcp://HOST:PORT`, or `tls://` for
// the same protocol inside TLS. HOST is an IPv4 address, a bracketed IPv6 address
// (`tcp://[::1]:5000`), or, to connect, a host name. A listener binds exactly the address it is
// given: there is no default, so listening beyond the loopback interface is always written out.
// python/cuda_ipc/link/transport/link_url.py applies the same rules step for step, with the same error code
// (ERR_INVALID_URL); test/fixtures/link-urls.json is the list both languages' tests read.
import { isIP } from 'node:net';
import { invalidUrl } from '../../arg-errors.js';

/** The URL of a link between machines: `tcp://HOST:PORT` or `tls://HOST:PORT`. */
export type LinkUrl = `tcp://${string}` | `tls://${string}`;

/** A LinkUrl taken apart. */
export interface ParsedLinkUrl {
  readonly scheme: 'tcp' | 'tls';
  /** An IP address (without brackets) or a host name, as written. */
  readonly host: string;
  /** 0 for "any free port" (listen only). */
  readonly port: number;
  /** 4 or 6 for an IP address, 0 for a host name. */
  readonly family: 0 | 4 | 6;
}

/** The forms a link URL takes, for messages. */
export const LINK_URL_FORMS =
  'tcp://HOST:PORT or tls://HOST:PORT (HOST an IPv4 address, an IPv6 address in brackets or, to connect, a host name), e.g. tcp://127.0.0.1:5000 or tcp://[::1]:5000';

const SCHEME_RE = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//;
const REST_RE = /^(?:\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?)\]|([A-Za-z0-9.-]+))(?::([0-9]+))?$/;
const HOST_NAME_RE = /^(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$/;

/** Whether `value` names a link between machines (tcp:// or tls://) rather than a local listener. */
export function isLinkUrl(value: unknown): value is LinkUrl {
  return typeof value === 'string' && /^(tcp|tls):\/\//.test(value);
}

/**
 * Whether `value` is written as a URL (`SCHEME://...`, any scheme): such a string is never a link
 * name or a file; parseLinkUrl says whether it is a link URL.
 */
export function isUrl(value: unknown): boolean {
  return typeof value === 'string' && SCHEME_RE.test(value);
}

/**
 * Parses `url` for `what` ('listen' binds exactly an IP address, port 0 allowed; 'connect' also
 * takes a host name, port 1..65535).
 * @throws TypeError ERR_INVALID_URL saying what is wrong and the forms a link URL takes.
 */
export function parseLinkUrl(url: string, what: 'listen' | 'connect'): ParsedLinkUrl {
  const shown = `'${printable(String(url))}'`;
  const bad = (why: string) => invalidUrl(`${what}: ${shown} ${why}; write ${LINK_URL_FORMS}`);
  if (typeof url !== 'string') throw bad('is not a string');
  const head = SCHEME_RE.exec(url);
  if (!head) throw bad('is not a link URL');
  const scheme = head[1]!;
  if (scheme !== 'tcp' && scheme !== 'tls') throw bad(`is not a link URL: its scheme is ${printable(scheme)}://, and a link's is tcp:// or tls://`);
  const rest = url.slice(head[0].length);
  const m = REST_RE.exec(rest);
  if (!m) {
    if (!rest.includes('[') && rest.split(':').length > 2) throw bad('is not a link URL: an IPv6 address goes in brackets');
    throw bad('is not a link URL');
  }
  const [, bracketed, name, digits] = m;
  if (digits === undefined) throw bad('has no port (a link URL always names one; 0 picks a free one to listen)');
  const port = Number(digits);
  if (digits.length > 5 || port > 65535 || (what === 'connect' && port === 0)) {
    throw bad(`has port ${printable(digits)}, which is not ${what === 'connect' ? '1..65535' : '0..65535 (0: any free port)'}`);
  }
  if (bracketed !== undefined) {
    if (isIP(bracketed) !== 6) throw bad(`is not a link URL: brackets hold an IPv6 address, e.g. tcp://[::1]:5000, and ${printable(bracketed)} is not one`);
    return { scheme, host: bracketed, port, family: 6 };
  }
  const host = name!;
  if (isIP(host) === 4) return { scheme, host, port, family: 4 };
  if (/^[0-9.]+$/.test(host)) throw bad(`is not a link URL: ${host} is not an IPv4 address (four numbers 0..255 without leading zeros)`);
  if (what === 'listen') {
    throw bad('names a host, and a listener binds an IP address exactly: give the address of the interface to listen on (127.0.0.1 for this machine only, 0.0.0.0 for every interface)');
  }
  if (!HOST_NAME_RE.test(host)) throw bad(`is not a link URL: ${printable(host)} is not a host name or an IP address`);
  return { scheme, host, port, family: 0 };
}

/** The URL of `address`:`port` under `scheme` (IPv6 in brackets). */
export function formatLinkUrl(scheme: 'tcp' | 'tls', address: string, port: number): LinkUrl {
  return `${scheme}://${isIP(address) === 6 ? `[${address}]` : address}:${port}`;
}

/** `s` for a message: control characters escaped, at most 200 characters. */
function printable(s: string): string {
  const t = s.length > 200 ? `${s.slice(0, 200)}...` : s;
  return t.replace(/[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g, (c) => (c.charCodeAt(0) < 0x100 ? `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}` : `\\u${c.charCodeAt(0).toString(16)}`));
}
