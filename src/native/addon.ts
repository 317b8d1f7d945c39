// Loads the addon (the local build when there is one, else a prebuilt binary that matches).
// Importing this never touches CUDA: libcuda is opened on the first CUDA call. Where no addon
// fits, the error (ERR_NO_NATIVE_BUILD) says how to build one from source.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { existsSync, readdirSync } from 'node:fs';
import { IpcError } from '../errors.js';
import type { CudaAddon } from './driver-types.js';
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

const loadBinding = require('node-gyp-build') as ((dir: string) => unknown) & { resolve(dir: string): string };

/** The prebuilt targets this package carries, e.g. ['linux-arm64', 'linux-x64']. */
function prebuiltTargets(root: string): string[] {
  try {
    return readdirSync(join(root, 'prebuilds')).sort();
  } catch {
    return [];
  }
}

const FROM_SOURCE =
  'Build it from source for this machine: `npm rebuild cuda-ipc` in your project (it needs a C++17 compiler, make and python3; ' +
  'no CUDA toolkit). If your npm blocks install scripts, run `npm approve-scripts cuda-ipc` first.';

/**
 * node-gyp-build's failures, said for a user: which machine this is, what the package carries,
 * and how to build the addon from source (npm 11 may not have run the install script that would).
 */
function noNativeBuild(root: string, e: unknown): IpcError {
  const message = String((e as Error)?.message ?? e);
  const here = `${process.platform}-${process.arch}${process.platform === 'linux' ? `, ${libcName()}` : ''}, Node ${process.versions.node}`;
  const carried = prebuiltTargets(root);
  const prebuilt = carried.length ? `it carries prebuilt addons for ${carried.join(', ')} (glibc 2.34 or newer)` : 'it carries no prebuilt addon';
  if (message.startsWith('No native build was found')) {
    return new IpcError('ERR_NO_NATIVE_BUILD', `cuda-ipc has no native addon for this machine (${here}): ${prebuilt}, and none was built here. ${FROM_SOURCE}`, { cause: e });
  }
  let file = '';
  try {
    file = ` ${loadBinding.resolve(root)}`;
  } catch {
    // The message says enough.
  }
  return new IpcError(
    'ERR_NO_NATIVE_BUILD',
    `cuda-ipc's native addon${file} does not load on this machine (${here}): ${message.trim()}. ${FROM_SOURCE}`,
    { cause: e },
  );
}

/** glibc or musl, as far as Node's process report tells (it names glibc's version when present). */
function libcName(): string {
  const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
  return header?.glibcVersionRuntime ? `glibc ${header.glibcVersionRuntime}` : 'not glibc';
}

function loadAddon(root: string): Addon {
  try {
    return loadBinding(root) as Addon;
  } catch (e) {
    throw noNativeBuild(root, e);
  }
}

export const addon = loadAddon(packageRoot());
