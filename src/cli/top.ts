// `cuda-ipc top`: the status view, redrawn every interval until q. On a terminal it takes the
// alternate screen (like top and less) and gives it back on the way out, whatever the way out.
import { collectStatus } from '../observe/reader.js';
import { countOption, secondsOption, type ParsedArgs } from './args.js';
import { directoryOption, formatStatus } from './status.js';

const ALT_SCREEN_ON = '\x1b[?1049h';
const ALT_SCREEN_OFF = '\x1b[?1049l';
const CURSOR_HIDE = '\x1b[?25l';
const CURSOR_SHOW = '\x1b[?25h';
const HOME = '\x1b[H';
const CLEAR_LINE_END = '\x1b[K';
const CLEAR_BELOW = '\x1b[J';
const INVERSE = '\x1b[7m';
const PLAIN = '\x1b[0m';

function frame(directory: string | undefined, intervalMs: number, columns: number, rows: number): string[] {
  const snapshot = collectStatus({ directory });
  const time = new Date().toTimeString().slice(0, 8);
  const header = `cuda-ipc top  ${time}  every ${intervalMs / 1000} s  q quits`;
  const body = formatStatus(snapshot);
  let lines = [header, ...body];
  if (lines.length > rows) {
    const hidden = lines.length - (rows - 1);
    lines = [...lines.slice(0, rows - 1), `... ${hidden} more lines: enlarge the window, or use cuda-ipc status`];
  }
  return lines.map((l) => (l.length > columns ? l.slice(0, Math.max(0, columns - 1)) + '>' : l));
}

export async function top(args: ParsedArgs): Promise<number> {
  const intervalMs = secondsOption(args, 'interval', 1);
  const iterations = args.values.iterations === undefined ? Infinity : countOption(args, 'iterations', 1);
  const directory = directoryOption(args);
  const out = process.stdout;
  const input = process.stdin;
  const tty = out.isTTY === true;
  // A folder that cannot be read (not private, say) fails here, before the terminal is taken over.
  collectStatus({ directory, removeStale: false });

  return new Promise<number>((resolve, reject) => {
    let shown = 0;
    let timer: NodeJS.Timeout | undefined;
    let done = false;

    const render = (): void => {
      if (done) return;
      try {
        draw();
      } catch (e) {
        // Give the terminal back before saying what went wrong.
        finish(1);
        reject(e);
      }
    };

    const draw = (): void => {
      if (tty) {
        const lines = frame(directory, intervalMs, out.columns || 80, out.rows || 24);
        lines[0] = INVERSE + lines[0]! + CLEAR_LINE_END + PLAIN;
        out.write(HOME + lines.map((l) => l + CLEAR_LINE_END).join('\n') + CLEAR_BELOW);
      } else {
        const lines = frame(directory, intervalMs, Infinity, Infinity);
        out.write((shown > 0 ? '\n' : '') + lines.join('\n') + '\n');
      }
      shown++;
      if (shown >= iterations) finish(0);
    };

    const onKey = (data: Buffer | string): void => {
      const s = typeof data === 'string' ? data : data.toString('latin1');
      if (/[qQ\x03\x04]/.test(s)) finish(0);
    };
    const onSignal = (): void => finish(0);

    function finish(code: number): void {
      if (done) return;
      done = true;
      clearInterval(timer);
      out.off('resize', render);
      input.off('data', onKey);
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      process.off('SIGHUP', onSignal);
      if (input.isTTY) input.setRawMode(false);
      input.pause();
      if (tty) out.write(CURSOR_SHOW + ALT_SCREEN_OFF);
      resolve(code);
    }

    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    process.on('SIGHUP', onSignal);
    if (tty) {
      out.write(ALT_SCREEN_ON + CURSOR_HIDE);
      out.on('resize', render);
    }
    // Keys: q (or Ctrl-C / Ctrl-D) quits; raw mode so a key needs no Enter.
    if (input.isTTY) input.setRawMode(true);
    input.on('data', onKey);
    input.resume();
    // Standard input at its end (e.g. /dev/null) must not end the loop: only q, a signal or --iterations do.
    input.on('end', () => input.pause());
    timer = setInterval(render, intervalMs);
    render();
  });
}
