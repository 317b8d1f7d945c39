// Links of the Markdown files a package ships: each relative link must name a file the package
// holds (an npm user has no repository to follow it to), each other link a public http(s) URL.
import { posix } from 'node:path';

/** A link that does not resolve: where it is, and why. */
export interface BrokenLink {
  readonly file: string;
  readonly target: string;
  readonly why: string;
}

/** The link targets of Markdown text: inline links and images, reference definitions, HTML href/src. */
export function markdownLinks(text: string): string[] {
  // Code is not Markdown: fenced blocks and inline code spans may hold anything that looks like a link.
  const prose = text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/(`+)[\s\S]*?\1/g, '');
  const targets: string[] = [];
  // [text](target "title"), not after a backslash (TypeDoc writes `\[dispose\]()` for a method).
  for (const m of prose.matchAll(/(?<!\\)\]\(\s*<?([^)\s>]*)>?(?:\s+["'(][^)]*)?\)/g)) targets.push(m[1]!);
  for (const m of prose.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/gm)) targets.push(m[1]!);
  for (const m of prose.matchAll(/<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*["']([^"']*)["']/gi)) targets.push(m[1]!);
  return targets;
}

/**
 * Every link of every Markdown file in `files` (paths inside the package, '/'-separated) that does
 * not resolve: relative links must name a file in `files` (an anchor-only link stays in its page),
 * absolute ones must be http(s) URLs of a public host.
 */
export function brokenLinks(files: readonly string[], read: (file: string) => string): BrokenLink[] {
  const shipped = new Set(files);
  const broken: BrokenLink[] = [];
  for (const file of files.filter((f) => f.endsWith('.md'))) {
    for (const target of markdownLinks(read(file))) {
      const why = check(file, target, shipped);
      if (why) broken.push({ file, target, why });
    }
  }
  return broken;
}

function check(file: string, target: string, shipped: ReadonlySet<string>): string | undefined {
  if (target === '') return 'an empty link';
  if (target.startsWith('#')) return undefined;
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(target)?.[1]?.toLowerCase();
  if (scheme !== undefined) {
    if (scheme !== 'http' && scheme !== 'https') return `a ${scheme}: link, not a public http(s) URL`;
    let host: string;
    try {
      host = new URL(target).hostname;
    } catch {
      return 'not a valid URL';
    }
    if (/^(localhost|127\.|0\.0\.0\.0|\[?::1\]?$)/.test(host) || !host.includes('.')) return `${host} is not a public host`;
    return undefined;
  }
  if (target.startsWith('/')) return 'an absolute path, which means nothing inside a package';
  let path = target.replace(/[?#].*$/, '');
  try {
    path = decodeURIComponent(path);
  } catch {
    return 'a malformed percent-escape';
  }
  const resolved = posix.normalize(posix.join(posix.dirname(file), path));
  if (resolved.startsWith('../')) return `${resolved} is outside the package`;
  if (shipped.has(resolved)) return undefined;
  return `${resolved} is not in the package`;
}
