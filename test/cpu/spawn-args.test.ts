// spawn() and spawnPython() from plain JavaScript (test/fixtures/spawn-bad-args.mjs calls the built dist/ without
// TypeScript): each bad argument is a TypeError with Node's code and a message naming the argument,
// and nothing starts (no child, no MODULE_NOT_FOUND stack); a good call still links.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const script = fileURLToPath(new URL('../../../test/fixtures/spawn-bad-args.mjs', import.meta.url));

const expected: Record<string, [code: string, says: RegExp]> = {
  'options where args go': ['ERR_INVALID_ARG_TYPE', /"args" argument must be an array of strings\. Received an instance of Object; options go third/],
  'a number for the module': ['ERR_INVALID_ARG_TYPE', /"module" argument must be of type string or an instance of URL\. Received type number \(42\)/],
  'no module at all': ['ERR_INVALID_ARG_TYPE', /"module" argument .* Received undefined/],
  'an empty module path': ['ERR_INVALID_ARG_VALUE', /"module" argument is empty/],
  'a string for args': ['ERR_INVALID_ARG_TYPE', /"args" argument must be an array of strings\. Received type string \('x'\)/],
  'a number among args': ['ERR_INVALID_ARG_TYPE', /"args\[1\]" argument must be of type string/],
  'a string for options': ['ERR_INVALID_ARG_TYPE', /"options" argument must be of type object/],
  'null for options': ['ERR_INVALID_ARG_TYPE', /"options" argument must be of type object\. Received null/],
  'a string for execArgv': ['ERR_INVALID_ARG_TYPE', /"options\.execArgv" property must be an array of strings/],
  'a misspelt option': ['ERR_INVALID_ARG_VALUE', /unknown option 'timout' \(did you mean 'timeout'\?\)/],
  'a number for allowUids': ['ERR_INVALID_ARG_TYPE', /"options\.allowUids" property/],
  'a string for frameRing': ['ERR_INVALID_ARG_TYPE', /"options\.frameRing" property must be of type boolean/],
  'a missing module path': ['ERR_INVALID_ARG_VALUE', /spawn: \/.*\/missing-module-for-the-test\.mjs does not exist \(a path is relative to the working directory/],
  'a missing module URL': ['ERR_INVALID_ARG_VALUE', /spawn: \/.*\/test\/fixtures\/missing-module-for-the-test\.mjs does not exist$/],
  'python: a number for the module': ['ERR_INVALID_ARG_TYPE', /"module" argument must be of type string or an instance of URL\. Received type number \(42\)/],
  'python: an empty module': ['ERR_INVALID_ARG_VALUE', /spawnPython: the "module" argument is empty; give the module name or \.py file/],
  'python: options where args go': ['ERR_INVALID_ARG_TYPE', /"args" argument must be an array of strings\. Received an instance of Object; options go third: spawnPython\(module, \[\], options\)/],
  'python: a number among args': ['ERR_INVALID_ARG_TYPE', /"args\[1\]" argument must be of type string/],
  'python: null for options': ['ERR_INVALID_ARG_TYPE', /"options" argument must be of type object\. Received null/],
  'python: a string for pythonArgs': ['ERR_INVALID_ARG_TYPE', /"options\.pythonArgs" property must be an array of strings/],
  'python: a number for python': ['ERR_INVALID_ARG_TYPE', /"options\.python" property must be a non-empty string/],
  'python: execArgv': ['ERR_INVALID_ARG_VALUE', /unknown option 'execArgv'.*pythonArgs/],
};

test('spawn from plain JavaScript: bad arguments are typed errors with codes, at once, starting nothing; a good call links', () => {
  const r = spawnSync(process.execPath, [script], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  const results = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as { name: string; error?: string; code?: string; message?: string; resolved?: boolean; echoed?: unknown });
  const seen = new Set<string>();
  for (const res of results) {
    if (res.name === 'a good call') {
      assert.equal(res.echoed, 'from plain JavaScript');
      seen.add(res.name);
      continue;
    }
    const want = expected[res.name];
    assert.ok(want, `unexpected case ${res.name}`);
    assert.equal(res.resolved, undefined, `${res.name}: spawn started a child`);
    assert.equal(res.error, 'TypeError', `${res.name}: ${res.message}`);
    assert.equal(res.code, want[0], `${res.name}: ${res.message}`);
    assert.match(res.message!, want[1], res.name);
    seen.add(res.name);
  }
  assert.deepEqual([...seen].sort(), [...Object.keys(expected), 'a good call'].sort(), 'every case ran');
  assert.doesNotMatch(r.stderr, /MODULE_NOT_FOUND|Cannot find module/, 'no child ran a missing module');
});
