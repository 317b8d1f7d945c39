// Loads the addon (a prebuilt binary when one matches, else the local build). Importing this
// never touches CUDA: libcuda is opened on the first CUDA call.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { existsSync } from 'node:fs';
import type { CudaAddon } from './cuda/driver-types.js';
import type { PosixAddon } from './posix-types.js';
import type { ChannelAddon } from './channel-types.js';

const require = createRequire(import.meta.url);

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('cuda-ipc: cannot find the package root from ' + import.meta.url);
    dir = up;
  }
  return dir;
}

export type Addon = CudaAddon & PosixAddon & ChannelAddon;

const loadBinding = require('node-gyp-build') as (dir: string) => unknown;
export const addon = loadBinding(packageRoot()) as Addon;
