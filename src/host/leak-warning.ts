// A FinalizationRegistry backstop that tells the user, once per kind of resource, that one was
// garbage-collected without close(). Freeing is left to the native finalizers; this only warns.
const warned = new Set<string>();

export function leakRegistry(what: string): FinalizationRegistry<string> {
  return new FinalizationRegistry<string>((detail) => {
    if (warned.has(what)) return;
    warned.add(what);
    process.emitWarning(
      `${what} was garbage-collected without close() (${detail}). Close it, or declare it with \`using\`, ` +
        'so that its memory and file descriptor are released when you are done with it.',
      { code: 'CUDA_IPC_LEAK' },
    );
  });
}
