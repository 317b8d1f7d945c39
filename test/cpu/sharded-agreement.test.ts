// Node and Python agree on sharded layouts and plans: the same scenarios built by each language's
// builder give the same layout records byte for byte; Python decodes Node's records and writes
// them back unchanged; both plan the same pairs, paths and runs (whole plan and each rank's own)
// with the same fingerprint, and refuse the same broken layouts with the same code, tensor and range.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { LayoutBuilder, LayoutError, encodeLayout, planSharded, type ShardPlan, type RankLayout } from '../../src/tensors/sharded/index.js';
import { scenarios } from './sharded-scenarios.js';
import { noPython, pythonFixture, PYTHON, PYTHON_PACKAGE_DIR } from '../helpers/python.js';

const hex = (l: RankLayout): string => Buffer.from(encodeLayout(l)).toString('hex');
const planJson = (p: ShardPlan) => ({ fingerprint: p.fingerprint, scope: p.scope, pairs: p.pairs.map((x) => [x.src, x.dst, x.path, x.bytes, [...x.runs]]) });

function broken(): RankLayout[][] {
  const src = (r: number, start: number, length: number) => new LayoutBuilder({ rank: r, node: 'n', gpu: r }).hold('w', { dtype: 'float16', shape: [10, 4], start: [start, 0], length: [length, 4] }).build();
  const dst = new LayoutBuilder({ rank: 9, node: 'm', gpu: 0 }).need('w', { dtype: 'float16', shape: [10, 4] }).build();
  const f32 = new LayoutBuilder({ rank: 9, node: 'm', gpu: 0 }).need('w', { dtype: 'float32', shape: [10, 4] }).build();
  const wide = new LayoutBuilder({ rank: 9, node: 'm', gpu: 0 }).need('w', { dtype: 'float16', shape: [10, 5] }).build();
  return [[src(0, 0, 3), src(1, 5, 5), dst], [src(0, 0, 10), f32], [src(0, 0, 10), wide], [src(0, 0, 6), src(1, 4, 6), dst]];
}

function errorOf(layouts: RankLayout[]): unknown {
  try {
    return planJson(planSharded(layouts));
  } catch (e) {
    if (!(e instanceof LayoutError)) throw e;
    return { error: { code: e.code, tensor: e.tensor ?? null, rank: e.rank ?? null, range: e.range ? { start: [...e.range.start], length: [...e.range.length] } : null } };
  }
}

test('Node and Python: the same layout records, the same plans, the same refusals', { skip: noPython }, () => {
  const all = scenarios();
  const request = { scenarios: all.map((s) => ({ layouts: s.layouts.map(hex) })), cases: broken().map((c) => c.map(hex)) };
  const r = spawnSync(PYTHON, [pythonFixture('sharded_plan_child.py')], {
    input: JSON.stringify(request), encoding: 'utf8', maxBuffer: 64 << 20, timeout: 120_000,
    env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR },
  });
  assert.equal(r.status, 0, r.stderr);
  const got = JSON.parse(r.stdout);
  assert.equal(got.scenarios.length, all.length);
  all.forEach((s, i) => {
    const py = got.scenarios[i];
    assert.equal(py.name, s.name);
    assert.deepEqual(py.built, request.scenarios[i]!.layouts, `${s.name}: Python's builder wrote other bytes`);
    assert.deepEqual(py.reencoded, request.scenarios[i]!.layouts, `${s.name}: Python re-encoded Node's records differently`);
    assert.deepEqual(py.plan, planJson(planSharded(s.layouts)), `${s.name}: the whole plans differ`);
    assert.deepEqual(py.own, s.layouts.map((l) => planJson(planSharded(s.layouts, { rank: l.rank }))), `${s.name}: a rank's own plan differs`);
  });
  const cases = broken().map(errorOf);
  assert.deepEqual(cases.map((c: any) => c.error?.code), ['ERR_LAYOUT_UNCOVERED', 'ERR_LAYOUT_DTYPE', 'ERR_LAYOUT_SHAPE', undefined]);
  assert.deepEqual(got.cases, cases);
});
