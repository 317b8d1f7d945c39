// A pool's stash of released blocks: an allocation whose last buffer closed and whose last lease
// ended is kept, with the export data it already has, for the next allocate() of the same size
// on the default stream, instead of being freed. Handing out a fresh 1 MiB pool buffer then costs
// neither cuMemAllocFromPoolAsync nor, at its send, cuMemPoolExportPointer (15-18 us).
//
// Why it is safe: a block comes back only after every peer released it (their leases ended, so
// their mappings are gone, as a free would need anyway); it is handed out again only to an
// allocation on the stream the free would have been ordered on (the legacy default stream), which
// is how the driver itself reuses a block in stream order; a forced close never stashes. The
// export data stays the allocation's own, since the allocation is the same one.
//
// Bounded: at most `maxBlocks` blocks and `maxBytes` bytes, the oldest freed first; a block larger
// than `maxBytes` is never kept.

/** What the stash keeps (a pool allocation). */
export interface StashedBlock {
  readonly byteLength: number;
}

export class BlockStash<B extends StashedBlock> {
  readonly #bySize = new Map<number, B[]>();
  /** Every kept block, oldest first. */
  readonly #order: B[] = [];
  #bytes = 0;

  constructor(
    readonly maxBlocks: number,
    readonly maxBytes: number,
  ) {}

  get count(): number {
    return this.#order.length;
  }
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * Keeps `block`. Returns what the caller must free now: the block itself when it cannot be
   * kept, or the oldest blocks it pushed out; often nothing.
   */
  put(block: B): B[] {
    if (this.maxBlocks <= 0 || block.byteLength > this.maxBytes) return [block];
    let list = this.#bySize.get(block.byteLength);
    if (!list) this.#bySize.set(block.byteLength, (list = []));
    list.push(block);
    this.#order.push(block);
    this.#bytes += block.byteLength;
    const out: B[] = [];
    while (this.#order.length > this.maxBlocks || this.#bytes > this.maxBytes) out.push(this.#remove(this.#order[0]!));
    return out;
  }

  /** A kept block of exactly `byteLength` bytes (the most recently kept), or undefined. */
  take(byteLength: number): B | undefined {
    const list = this.#bySize.get(byteLength);
    const block = list?.[list.length - 1];
    return block === undefined ? undefined : this.#remove(block);
  }

  /** Every kept block, for the caller to free (trim, close, an allocation that ran out of memory). */
  drain(): B[] {
    const all = this.#order.slice();
    for (const b of all) this.#remove(b);
    return all;
  }

  #remove(block: B): B {
    const list = this.#bySize.get(block.byteLength)!;
    list.splice(list.lastIndexOf(block), 1);
    if (list.length === 0) this.#bySize.delete(block.byteLength);
    this.#order.splice(this.#order.indexOf(block), 1);
    this.#bytes -= block.byteLength;
    return block;
  }
}
