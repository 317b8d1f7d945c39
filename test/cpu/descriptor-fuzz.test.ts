import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import * as api from '../../src/ipc/descriptor.js';
import { FuzzFailure, runDescriptorFuzz, type DescriptorApi } from './descriptor-fuzzer.js';

// CUDA_IPC_FUZZ_SEED reproduces a failed run; otherwise each run explores a new seed.
const seed = process.env.CUDA_IPC_FUZZ_SEED !== undefined ? Number(process.env.CUDA_IPC_FUZZ_SEED) >>> 0 : randomInt(2 ** 32);

test(`mutated and random descriptors are rejected with descriptor codes, never another exception (seed ${seed})`, (t) => {
  t.diagnostic(`fuzz seed ${seed} (rerun with CUDA_IPC_FUZZ_SEED=${seed})`);
  const started = performance.now();
  const stats = runDescriptorFuzz({ cases: 100_000, seed });
  t.diagnostic(`${JSON.stringify(stats)} in ${Math.round(performance.now() - started)} ms`);
  const rejected = Object.values(stats.rejected).reduce((a, b) => a + b, 0);
  assert.equal(stats.cases, 100_000);
  assert.ok(rejected >= 10_000, `only ${rejected} inputs were rejected`);
  assert.ok(stats.decodedOk > 0, 'some inputs must survive mutation and be checked for round trips');
  // The mutations reach every kind of rejection.
  for (const code of api.DESCRIPTOR_ERROR_CODES) assert.ok((stats.rejected[code] ?? 0) > 0, `no ${code} seen`);
  assert.ok(stats.binaryCases > 40_000 && stats.jsonCases > 40_000);
});

test('the fuzzer reports a decoder that throws anything but a descriptor IpcError', () => {
  const crashing: DescriptorApi = {
    ...api,
    decodeDescriptor: ((bytes: Uint8Array) => {
      if (bytes.length > 0 && bytes.length < 16) throw new RangeError('Offset is outside the bounds of the DataView');
      return api.decodeDescriptor(bytes);
    }) as DescriptorApi['decodeDescriptor'],
  };
  assert.throws(() => runDescriptorFuzz({ cases: 5_000, seed: 1, api: crashing }), (e: unknown) => {
    assert.ok(e instanceof FuzzFailure);
    assert.match(e.message, /RangeError.*\n  input: bytes [0-9a-f]+\n  reproduce: .*--seed 1 --first \d+ --cases 1/);
    return true;
  });
});

test('the fuzzer reports an accepted input that does not round-trip', () => {
  const lossy: DescriptorApi = {
    ...api,
    parseDescriptorJson: ((input: unknown) => {
      const d = api.parseDescriptorJson(input);
      return d.kind === 'cuda-legacy-handle' ? { ...d, offset: d.offset + 1 } : d;
    }) as DescriptorApi['parseDescriptorJson'],
  };
  assert.throws(() => runDescriptorFuzz({ cases: 5_000, seed: 2, api: lossy }), /was accepted but/);
});
