// A node:test reporter that records every skipped test and suite (name, file, kind, reason) as
// JSON lines, for the summary scripts/run-tests.mjs prints at the end. Node's own summary counts
// skipped tests only, not skipped suites (whose tests never run).
export default async function* skipReporter(source) {
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const d = event.data;
    if (d.skip === undefined || d.skip === false) continue;
    yield JSON.stringify({
      kind: d.details?.type === 'suite' ? 'suite' : 'test',
      name: d.name,
      file: d.file,
      reason: typeof d.skip === 'string' ? d.skip : '(no reason given)',
    }) + '\n';
  }
}
