// Text that came from a file or another process (status records, descriptors, a consumer's
// report), made safe to print on a terminal: control characters become visible escapes, so that
// nothing read can move the cursor, retitle the window, clear the screen, fake a new line or
// reorder what follows (bidirectional overrides).
// C0 controls, DEL, C1 controls, line/paragraph separators, bidi embeddings/overrides/isolates.
const UNSAFE = /[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const NAMED: Readonly<Record<string, string>> = { '\n': '\\n', '\r': '\\r', '\t': '\\t', '\x1b': '\\e' };

const escape = (c: string): string => NAMED[c] ?? (c.charCodeAt(0) < 0x100 ? `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}` : `\\u${c.charCodeAt(0).toString(16)}`);

/** `text` with every control character written as an escape (`\e`, `\n`, `\x07`, `\u202e`). */
export function terminalSafe(text: string): string {
  return text.replace(UNSAFE, escape);
}

/** What JSON.stringify leaves as is in strings: DEL, C1, separators, bidi controls. */
const UNSAFE_IN_JSON = /[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/**
 * JSON text (JSON.stringify's) for a terminal, still valid JSON: C0 controls inside strings are
 * escaped by JSON.stringify already (the newlines left are its own indentation); the rest as `\uXXXX`.
 */
export function terminalSafeJson(json: string): string {
  return json.replace(UNSAFE_IN_JSON, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}
