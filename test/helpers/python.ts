// Python for tests: python3 (>= 3.10, standard library only) runs the cuda_ipc package in python/.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const PYTHON = process.env.CUDA_IPC_PYTHON ?? 'python3';

/** A file under test/python (from dist/test/helpers). */
export function pythonFixture(name: string): string {
  return fileURLToPath(new URL(`../../../test/python/${name}`, import.meta.url));
}

/** The repository's python/ folder (the cuda_ipc package). */
export const PYTHON_PACKAGE_DIR = fileURLToPath(new URL('../../../python', import.meta.url));

function probe(code: string): { ok: boolean; why: string } {
  const r = spawnSync(PYTHON, ['-c', code], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR } });
  if (r.error) return { ok: false, why: `${PYTHON} is not available: ${r.error.message}` };
  if (r.status !== 0) return { ok: false, why: (r.stderr || r.stdout).trim().split('\n').pop() ?? `exit ${r.status}` };
  return { ok: true, why: '' };
}

function reason(): string | undefined {
  const p = probe('import sys; assert sys.version_info >= (3, 10), "Python " + sys.version.split()[0] + " is older than 3.10"; import cuda_ipc');
  return p.ok ? undefined : `no usable python3 with the cuda_ipc package: ${p.why}`;
}

/** undefined where python3 (>= 3.10) imports cuda_ipc; otherwise the reason to skip. */
export const noPython: string | undefined = reason();

/** The reason to skip where `modules` (e.g. 'torch') do not import in python3 with a usable GPU. */
export function pythonLacks(modules: string): string | undefined {
  if (noPython) return noPython;
  const p = probe(`import ${modules}`);
  return p.ok ? undefined : `python3 lacks ${modules}: ${p.why}`;
}

/** undefined where python3's cuda_ipc loads its native helper (the C library next to the addon:
 * build/Release/cuda_ipc_py.so or a prebuilt one); otherwise why not. */
export const noPythonNative: string | undefined = noPython ?? (() => {
  const p = probe('import cuda_ipc; h = cuda_ipc.native_helper(); assert h.active, h.reason');
  return p.ok ? undefined : `cuda_ipc's native helper does not load: ${p.why}`;
})();

/** The Python hot paths to test, each with its environment and the reason it is skipped (if so). */
export const PYTHON_HOT_PATHS = [
  { name: 'native', env: { CUDA_IPC_PY_NATIVE: '1' }, skip: noPythonNative },
  { name: 'python', env: { CUDA_IPC_PY_NATIVE: '0' }, skip: noPython },
] as const;
