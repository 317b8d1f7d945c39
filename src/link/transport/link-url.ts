// The addresses of links between machines (PROTOCOL.md 2.3): `tcp://HOST:PORT`, or `tls://` for
// the same protocol inside TLS. HOST is an IPv4 address, a bracketed IPv6 address
// (`tcp://[::1]:5000`), or, to connect, a host name. A listener binds exactly the address it is
// given: there is no default, so listening beyond the loopback interface is always written out.
import { isIP } from 'node:net';
import { invalidArgValue } from '../../arg-errors.js';

/** The URL of a link between machines: `tcp://HOST:PORT` or `tls://HOST:PORT`. */
export type LinkUrl = `tcp://${string}` | `tls://${string}`;

/** A LinkUrl taken apart. */
export interface ParsedLinkUrl {
  readonly scheme: 'tcp' | 'tls';
  /** An IP address (without brackets) or a host name. */
  readonly host: string;
  /** 0 for "any free port" (listen only). */
  readonly port: number;
  /** 4 or 6 for an IP address, 0 for a host name. */
  readonly family: 0 | 4 | 6;
}

const URL_RE = /^(tcp|tls):\/\/(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):([0-9]{1,5})$/;
const HOST_NAME_RE = /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

/** Whether `value` names a link between machines (tcp:// or tls://) rather than a local listener. */
export function isLinkUrl(value: unknown): value is LinkUrl {
  return typeof value === 'string' && /^(tcp|tls):\/\//.test(value);
}

/**
 * Parses `url` for `what` ('listen' binds exactly an IP address, port 0 allowed; 'connect' also
 * takes a host name, port 1..65535). A TypeError (ERR_INVALID_ARG_VALUE) says what is wrong.
 */
export function parseLinkUrl(url: string, what: 'listen' | 'connect'): ParsedLinkUrl {
  const m = URL_RE.exec(url);
  const example = 'tcp://127.0.0.1:5000, tcp://[::1]:5000 or tls://10.0.0.2:5000';
  if (!m) throw invalidArgValue(`${what}: '${printable(url)}' is not a link URL; write tcp://HOST:PORT or tls://HOST:PORT, e.g. ${example}`);
  const scheme = m[1] as 'tcp' | 'tls';
  const bracketed = m[2];
  const host = bracketed ?? m[3]!;
  const port = Number(m[4]);
  if (port > 65535 || (what === 'connect' && port === 0)) {
    throw invalidArgValue(`${what}: port ${m[4]} in '${printable(url)}' is not ${what === 'connect' ? '1..65535' : '0..65535 (0: any free port)'}`);
  }
  const ip = isIP(host);
  if (bracketed !== undefined && ip !== 6) throw invalidArgValue(`${what}: '${printable(url)}': brackets hold an IPv6 address, e.g. tcp://[::1]:5000`);
  if (ip === 6 && bracketed === undefined) throw invalidArgValue(`${what}: '${printable(url)}': write an IPv6 address in brackets, e.g. tcp://[::1]:5000`);
  if (ip === 0) {
    if (what === 'listen') {
      throw invalidArgValue(`listen: '${printable(url)}' names a host, and a listener binds an IP address exactly: give the address of the interface to listen on (127.0.0.1 for this machine only, 0.0.0.0 for every interface)`);
    }
    if (!HOST_NAME_RE.test(host)) throw invalidArgValue(`connect: '${printable(host)}' is not a host name or an IP address`);
  }
  return { scheme, host, port, family: ip as 0 | 4 | 6 };
}

/** The URL of `address`:`port` under `scheme` (IPv6 in brackets). */
export function formatLinkUrl(scheme: 'tcp' | 'tls', address: string, port: number): LinkUrl {
  return `${scheme}://${isIP(address) === 6 ? `[${address}]` : address}:${port}`;
}

/** `s` for a message: control characters escaped, at most 200 characters. */
function printable(s: string): string {
  const t = s.length > 200 ? `${s.slice(0, 200)}...` : s;
  return t.replace(/[\x00-\x1f\x7f-\x9f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}
