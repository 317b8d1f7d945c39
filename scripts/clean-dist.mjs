#!/usr/bin/env node
// Removes dist/src before the package build (prepack): whatever an earlier build left there (a
// module since renamed or removed, source maps) would otherwise be packed with the new one.
import { rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

rmSync(join(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'src'), { recursive: true, force: true });
