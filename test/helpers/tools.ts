// Development tools some tests run (TypeScript, TypeDoc, npm and its registry): where one is
// missing (a machine that got the built tree without devDependencies, or no network), those tests
// skip with the reason instead of failing for a reason that is not theirs.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, join } from 'node:path';

const require = createRequire(import.meta.url);

/** Why `pkg` (a devDependency) cannot be used here, or undefined when it can. */
export function missingPackage(pkg: string): string | undefined {
  // Looked up as Node would, by folder: some packages do not export their package.json.
  const found = (require.resolve.paths(pkg) ?? []).some((d) => existsSync(join(d, pkg, 'package.json')));
  return found ? undefined : `${pkg} is not installed here (a devDependency: npm install)`;
}

/** Why npm cannot install from its registry here, or undefined when it can (`npm ping`). */
export function noNpmRegistry(): string | undefined {
  if (!(process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, 'npm')))) return 'npm is not on PATH here';
  const r = spawnSync('npm', ['ping'], { encoding: 'utf8', timeout: 30_000 });
  if (r.status !== 0) return `the npm registry is not reachable from here (npm ping: ${(r.stderr || r.error?.message || '').trim().split('\n').pop()})`;
  return undefined;
}
