// Where an NCCL library may be, in the order loadNccl tries them: the path the caller gave, else
// the one CUDA_IPC_NCCL_LIBRARY names (either of those alone: a library someone chose is never
// silently replaced by another), else the system's libnccl.so.2 (the dynamic loader's search:
// LD_LIBRARY_PATH, ldconfig), else the copy PyTorch's wheels install (nvidia-nccl-cu12 and kin:
// nvidia/nccl/lib/libnccl.so.2 in python3's site-packages), found without importing torch.
import { execFile } from 'node:child_process';
import { statSync } from 'node:fs';
import { printable } from './probe.js';
import type { NcclAttempt } from './errors.js';

/** The environment variable that names the NCCL library file to use. */
export const NCCL_LIBRARY_ENV = 'CUDA_IPC_NCCL_LIBRARY';
/** The soname the system's NCCL is found by. */
export const SYSTEM_NCCL = 'libnccl.so.2';

/** Where a candidate came from. */
export type NcclSource = NcclAttempt['source'];

export interface NcclCandidate {
  source: NcclSource;
  path: string;
}

// importlib.util.find_spec('nvidia') finds the namespace package's folders without importing
// anything of torch's; site-packages and sys.path are scanned too (a wheel whose nvidia/ folder
// find_spec does not report, e.g. one beside an nvidia package with an __init__.py).
const FIND_WHEEL = `
import importlib.util, json, os, site, sys
dirs = []
try:
    spec = importlib.util.find_spec('nvidia')
    if spec is not None and spec.submodule_search_locations:
        dirs += [str(d) for d in spec.submodule_search_locations]
except Exception:
    pass
roots = list(getattr(site, 'getsitepackages', lambda: [])())
try:
    roots.append(site.getusersitepackages())
except Exception:
    pass
for root in roots + sys.path:
    d = os.path.join(root or '.', 'nvidia')
    if os.path.isdir(d) and d not in dirs:
        dirs.append(d)
print(json.dumps([os.path.join(d, 'nccl', 'lib', 'libnccl.so.2') for d in dirs]))
`;

/** The interpreter asked for PyTorch's wheel: the option, else $CUDA_IPC_PYTHON, else python3. */
export function pythonFor(option: string | undefined): string {
  return option ?? process.env.CUDA_IPC_PYTHON ?? 'python3';
}

function isFile(path: string): boolean {
  try {
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/**
 * The wheel copies of libnccl.so.2 that `python` can see (existing files, in its search order),
 * or why there are none. Never throws; gives up on python after 20 s.
 */
export function wheelLibraries(python: string): Promise<{ paths: string[]; why: string }> {
  return new Promise((resolve) => {
    execFile(python, ['-c', FIND_WHEEL], { timeout: 20_000, maxBuffer: 1 << 20, encoding: 'utf8' }, (error, stdout, stderr) => {
      if (error) {
        const why = (error as NodeJS.ErrnoException).code === 'ENOENT' ? `${python} was not found` : `${python} failed: ${printable(String(stderr || error.message).trim().split('\n').pop() ?? '')}`;
        resolve({ paths: [], why });
        return;
      }
      let listed: unknown;
      try {
        listed = JSON.parse(stdout);
      } catch {
        resolve({ paths: [], why: `${python} printed something unexpected` });
        return;
      }
      const all = Array.isArray(listed) ? listed.filter((p): p is string => typeof p === 'string') : [];
      const paths = [...new Set(all)].filter(isFile);
      resolve({ paths, why: paths.length ? '' : all.length ? `no nvidia/nccl/lib/libnccl.so.2 in ${all.length} nvidia package folder(s) ${python} sees` : `${python} sees no nvidia package (pip install nvidia-nccl-cu12, or torch, installs one)` });
    });
  });
}

/** The candidate named by the caller or the environment, if any: then it is the only one. */
export function chosenCandidate(path: string | undefined): NcclCandidate | undefined {
  if (path !== undefined) return { source: 'option', path };
  const env = process.env[NCCL_LIBRARY_ENV];
  if (env !== undefined && env !== '') return { source: 'env', path: env };
  return undefined;
}
