// spawnPython(): start a Python module as a child on a link, with the same handshake as spawn():
// the child calls cuda_ipc.parent_link() (the package in this repository's python/ folder, which is
// put on the child's PYTHONPATH).
import { existsSync } from 'node:fs';
import { delimiter, isAbsolute, resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';
import { IpcError } from '../../errors.js';
import { SPAWN_OPTION_KEYS, checkChildArguments, checkStrings, startLinkedChild, type SpawnOptions, type SpawnedChild } from './spawn.js';
import { checkOptionKeys, invalidArgType, invalidArgValue, received } from '../../arg-errors.js';

/** Options of spawnPython(): those of spawn() but execArgv, and the interpreter. */
export interface SpawnPythonOptions extends Omit<SpawnOptions, 'execArgv'> {
  /** The interpreter: default $CUDA_IPC_PYTHON, else 'python3' (found on PATH). */
  python?: string;
  /** Arguments for the interpreter itself, before the module (e.g. ['-X', 'dev']). */
  pythonArgs?: readonly string[];
  /** Put cuda-ipc's Python package on the child's PYTHONPATH (default true); turn it off when
   * `cuda_ipc` is installed in the interpreter's environment (pip install ./python). */
  addPythonPath?: boolean;
}

/** The folder holding the `cuda_ipc` Python package (python/ of this package). */
export function pythonPackageDirectory(): string {
  // dist/src/link/connect/spawn-python.js -> <package>/python
  return fileURLToPath(new URL('../../../../python', import.meta.url));
}

/** The keys of SpawnPythonOptions: any other is refused (a misspelt option would do nothing). */
const SPAWN_PYTHON_OPTION_KEYS: Readonly<Record<keyof SpawnPythonOptions, true>> = (() => {
  const { execArgv: _, ...keys } = SPAWN_OPTION_KEYS;
  return { ...keys, python: true, pythonArgs: true, addPythonPath: true };
})();

/**
 * Runs a module as `python -m` does, but without the working directory on sys.path: `-m` puts it
 * first, so a `cuda_ipc.py` (or a module of the same name as yours) planted in a shared working
 * directory would be imported instead of the real one. `-P` does this from Python 3.11 on; this
 * bootstrap does it on any version: sys.path[0] is the working directory ('') under `-c` unless
 * safe-path mode (-P, PYTHONSAFEPATH) left it out. Then runpy runs the module as `-m` would
 * (sys.argv[0] its file, __name__ '__main__').
 */
const RUN_MODULE_SAFELY = [
  'def _run():',
  '    import sys, runpy',
  "    if not getattr(sys.flags, 'safe_path', False) and sys.path and sys.path[0] == '':",
  '        del sys.path[0]',
  "    del globals()['_run']  # the module's globals start empty, as under -m",
  '    runpy._run_module_as_main(sys.argv.pop(1))',
  '_run()',
].join('\n');

let warnedEmptyEntries = false;

/**
 * PYTHONPATH without its empty entries (undefined when none is left). Python reads an empty entry
 * (a trailing or doubled ':') as the working directory, which would put back on sys.path what
 * RUN_MODULE_SAFELY takes off: a json.py planted there would run in the child. Dropping them is
 * said once per process, as a warning (code CUDA_IPC_PYTHONPATH).
 */
export function safePythonPath(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  const entries = value.split(delimiter);
  const kept = entries.filter((e) => e !== '');
  if (kept.length !== entries.length && value !== '' && !warnedEmptyEntries) {
    warnedEmptyEntries = true;
    process.emitWarning(
      `spawnPython: PYTHONPATH ${JSON.stringify(value)} has empty entries, which Python reads as the working directory; they were left out of the child's PYTHONPATH`,
      { code: 'CUDA_IPC_PYTHONPATH' },
    );
  }
  return kept.length ? kept.join(delimiter) : undefined;
}

/**
 * Starts `python3 <file.py> ...args` (`module` a URL, or a path ending in .py; Python puts the
 * file's own folder on sys.path, as always) or a module (`pkg.worker`, run as `python3 -m` would
 * but without the working directory on sys.path: see RUN_MODULE_SAFELY) with a link to this
 * process, and resolves once the child called `cuda_ipc.parent_link()`. Files are found as spawn()
 * finds them: a URL (`new URL('./worker.py', import.meta.url)`: beside the calling module) or a
 * path relative to the working directory (`process.cwd()`). `In`/`Out` type the link (see spawn()).
 * Empty entries of PYTHONPATH (`options.env`'s, else this process's) are dropped, with a warning
 * once per process: Python would read them as the working directory (see safePythonPath()).
 *
 * @throws IpcError (the promise rejects; the child is killed), as for spawn(): ERR_PEER_GONE when
 * the child exits first (an ImportError, a missing interpreter: the message says which),
 * ERR_PEER_REFUSED, ERR_TIMEOUT after `options.timeout` (30 s), an AbortError on `options.signal`.
 * @throws TypeError (the promise rejects at once; nothing starts) ERR_INVALID_ARG_VALUE for a .py
 * file that does not exist, a `module` that is empty or neither a file nor a module name, or an
 * option spawnPython does not know; ERR_INVALID_ARG_TYPE for a `module` that is not a string or
 * URL, `args` not an array of strings (options go third), `options` not an object, `pythonArgs`
 * not an array of strings, `python` not a non-empty string (the checks spawn() makes).
 */
export function spawnPython<In = unknown, Out = unknown>(module: string | URL, args?: readonly string[], options?: SpawnPythonOptions): Promise<SpawnedChild<In, Out>>;
export async function spawnPython(moduleArg: string | URL, argsArg?: readonly string[], optionsArg?: SpawnPythonOptions): Promise<SpawnedChild> {
  const { module, args, options } = checkChildArguments<SpawnPythonOptions>('spawnPython', moduleArg, argsArg, optionsArg);
  checkOptionKeys(options, SPAWN_PYTHON_OPTION_KEYS, 'spawnPython', { execArgv: 'arguments for the interpreter go in pythonArgs' });
  if (options.pythonArgs !== undefined) checkStrings(options.pythonArgs, 'options.pythonArgs');
  if (options.python !== undefined && (typeof options.python !== 'string' || options.python === '')) {
    throw invalidArgType(`The "options.python" property must be a non-empty string (the interpreter's path or name). ${received(options.python)}`);
  }
  const python = options.python ?? process.env.CUDA_IPC_PYTHON ?? 'python3';
  let target: string[];
  let what: string;
  if (module instanceof URL || module.startsWith('file:') || module.endsWith('.py')) {
    const path = module instanceof URL || module.startsWith('file:') ? fileURLToPath(module) : resolvePath(module);
    if (!existsSync(path)) throw invalidArgValue(`spawnPython: ${path} does not exist`);
    target = [path];
    what = path;
  } else if (/^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$/.test(module)) {
    target = ['-c', RUN_MODULE_SAFELY, module];
    what = `Python module ${module}`;
  } else {
    throw invalidArgValue(`spawnPython: ${JSON.stringify(module)} is neither a module name (pkg.mod) nor a .py file`);
  }
  const env = { ...(options.env ?? process.env) };
  const kept = safePythonPath(env.PYTHONPATH);
  if (options.addPythonPath !== false) {
    const dir = pythonPackageDirectory();
    env.PYTHONPATH = kept ? `${dir}${delimiter}${kept}` : dir;
  } else if (kept !== undefined) {
    env.PYTHONPATH = kept;
  } else {
    delete env.PYTHONPATH;
  }
  const { python: _p, pythonArgs, addPythonPath: _a, ...rest } = options;
  const cmd = isAbsolute(python) || !python.includes('/') ? python : resolvePath(python);
  try {
    return await startLinkedChild(cmd, [...(pythonArgs ?? []), ...target, ...args], { ...rest, env }, what);
  } catch (e) {
    if (e instanceof IpcError && e.code === 'ERR_PEER_GONE' && e.message.startsWith('could not start')) {
      throw new IpcError('ERR_PEER_GONE', `${e.message}; is ${python} installed? Pass { python: '/path/to/python3' } or set CUDA_IPC_PYTHON`, { cause: e });
    }
    throw e;
  }
}
