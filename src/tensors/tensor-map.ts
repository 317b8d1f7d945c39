// TensorMap: named tensors (DeviceArrays or HostArrays), the value a tensor set is sent as and
// received as. A map you build holds your arrays; a received map holds the allocations the
// message brought (one mapping each) and makes each named tensor, a view into them, on first use.
// Either way the map owns what it holds: close() closes every array it handed out, and for a
// received map that is when its memory is unmapped and the sender's lease ends.
import type { DeviceBuffer } from '../cuda/buffer.js';
import { IpcError } from '../errors.js';
import { HostBuffer } from '../host/host-buffer.js';
import { DeviceArray } from '../ipc/array.js';
import { dtypeInfo } from '../ipc/dtype.js';
import { HostArray } from './host-array.js';
import type { TensorLayout } from './wire.js';
import { invalidArgType } from '../arg-errors.js';

/** A tensor of a TensorMap: a typed view of device memory or of shared host memory. */
export type TensorArray = DeviceArray | HostArray;

/** Where a map's tensors live: 'mixed' when some are on a device and some in host memory. */
export type TensorMemory = 'device' | 'host' | 'mixed';

/** @internal What a received map is made of (for the transfer handler and in-place updates). */
export interface ReceivedTensors {
  readonly layout: TensorLayout;
  /** One buffer per allocation, over all of it, in the layout's allocation order. */
  readonly allocations: ReadonlyArray<DeviceBuffer | HostBuffer>;
}

/** @internal A map's contents for the transfer handler: what it was built from, or received as. */
export let tensorMapContents: (map: TensorMap) =>
  | { kind: 'built'; entries: ReadonlyMap<string, TensorArray>; version: number; cache: Map<string, unknown> }
  | { kind: 'received'; received: ReceivedTensors };
/** @internal A map over received allocations (the transfer handler's result). */
export let receivedTensorMap: (received: ReceivedTensors) => TensorMap;
/** @internal Sets what `metadata` returns (loadSafetensors: the files' __metadata__). */
export let setTensorMapMetadata: (map: TensorMap, metadata: Readonly<Record<string, string>>) => void;

function closedError(): IpcError {
  return new IpcError('ERR_CLOSED', 'this TensorMap is closed; keep it open while you use its tensors');
}

/**
 * Named tensors sent as one link message (each allocation they live in travels once) and received
 * as one: views into the sender's memory, made on first use. Closing the map closes every array it
 * handed out; for a received map that unmaps the memory and ends the sender's lease.
 */
export class TensorMap<A extends TensorArray = TensorArray> implements Iterable<[string, A]>, Disposable {
  #entries: Map<string, A> | undefined;
  #received: ReceivedTensors | undefined;
  /** Views made from a received map, by tensor index. */
  #views: Array<A | undefined> | undefined;
  #closed = false;
  /** Bumped by every change: cached encodings of the map are keyed by it. */
  #version = 0;
  readonly #cache = new Map<string, unknown>();
  #metadata: Readonly<Record<string, string>> = Object.freeze({});

  /** A map of your arrays (a Map, an object, or [name, array] pairs); the map owns them from now on. */
  constructor(entries?: Iterable<readonly [string, A]> | Readonly<Record<string, A>>) {
    this.#entries = new Map();
    if (entries === undefined) return;
    const pairs = Symbol.iterator in Object(entries) ? (entries as Iterable<readonly [string, A]>) : Object.entries(entries as Record<string, A>);
    for (const [name, array] of pairs) this.set(name, array);
  }

  /** Number of tensors. */
  get size(): number {
    return this.#received ? this.#received.layout.count : this.#entries!.size;
  }

  get closed(): boolean { return this.#closed; }

  /** Free-form string metadata: the `__metadata__` of a loaded safetensors checkpoint; empty otherwise (it does not travel). */
  get metadata(): Readonly<Record<string, string>> { return this.#metadata; }

  /** True for a map that arrived over a link (its tensors are views into the sender's memory). */
  get received(): boolean { return this.#received !== undefined; }

  /** Where the tensors live; undefined for an empty map. */
  get memory(): TensorMemory | undefined {
    let device = false;
    let host = false;
    if (this.#received) {
      for (const a of this.#received.allocations) (a instanceof HostBuffer ? (host = true) : (device = true));
    } else {
      for (const a of this.#entries!.values()) (a instanceof HostArray ? (host = true) : (device = true));
    }
    return device && host ? 'mixed' : device ? 'device' : host ? 'host' : undefined;
  }

  /** Bytes of all tensors' elements together. */
  get byteLength(): number {
    let n = 0;
    if (this.#received) for (const b of this.#received.layout.nbytes) n += b;
    else for (const a of this.#entries!.values()) n += a.size * dtypeInfo(a.dtype).itemsize;
    return n;
  }

  /** Whether the map has a tensor of that name. */
  has(name: string): boolean {
    return this.#received ? this.#received.layout.index.has(name) : this.#entries!.has(name);
  }

  /** The tensor called `name` (for a received map, a view made on first use and kept). */
  get(name: string): A | undefined {
    if (this.#closed) throw closedError();
    if (!this.#received) return this.#entries!.get(name);
    const i = this.#received.layout.index.get(name);
    return i === undefined ? undefined : this.#view(i);
  }

  /** Adds or replaces a tensor (maps you built only; a received map is the sender's and read-only). */
  set(name: string, array: A): this {
    if (this.#closed) throw closedError();
    if (this.#received) throw new IpcError('ERR_INVALID_STATE', 'a received TensorMap is read-only; build a new TensorMap (or copy with updateInPlace) to change tensors');
    if (typeof name !== 'string' || name.length === 0) throw invalidArgType(`tensor names are non-empty strings, got ${JSON.stringify(name)}`);
    if (!(array instanceof DeviceArray) && !(array instanceof HostArray)) {
      throw invalidArgType(`tensor ${JSON.stringify(name)} must be a DeviceArray or a HostArray, got ${(array as object)?.constructor?.name ?? typeof array}`);
    }
    this.#entries!.set(name, array);
    this.#version++;
    return this;
  }

  /** Removes a tensor from the map without closing it (maps you built only). */
  delete(name: string): boolean {
    if (this.#received) throw new IpcError('ERR_INVALID_STATE', 'a received TensorMap is read-only');
    const had = this.#entries!.delete(name);
    if (had) this.#version++;
    return had;
  }

  /** Tensor names, in the map's order (the sender's order for a received map). */
  *keys(): IterableIterator<string> {
    if (this.#received) yield* this.#received.layout.names;
    else yield* this.#entries!.keys();
  }

  /** The tensors, in the sender's order (a received map makes each view on first use). */
  *values(): IterableIterator<A> {
    for (const [, a] of this.entries()) yield a;
  }

  /** [name, tensor] pairs, in the sender's order. */
  *entries(): IterableIterator<[string, A]> {
    if (this.#closed) throw closedError();
    if (!this.#received) {
      yield* this.#entries!.entries();
      return;
    }
    const { names } = this.#received.layout;
    for (let i = 0; i < names.length; i++) yield [names[i]!, this.#view(i)];
  }

  /** Same as entries(). */
  [Symbol.iterator](): IterableIterator<[string, A]> { return this.entries(); }

  #view(i: number): A {
    const views = (this.#views ??= new Array(this.#received!.layout.count));
    let v = views[i];
    if (v) return v;
    const { layout, allocations } = this.#received!;
    const whole = allocations[layout.allocations[i]!]!;
    const meta = { dtype: layout.dtypes[i]!, shape: layout.shapes[i]!, strides: layout.strides[i]! };
    const part = whole.view(layout.offsets[i]!, layout.extents[i]!);
    try {
      v = (part instanceof HostBuffer ? new HostArray(part, meta) : new DeviceArray(part, meta)) as A;
    } catch (e) {
      part.close();
      throw e;
    }
    views[i] = v;
    return v;
  }

  /**
   * Closes every tensor of the map. For a received map, its memory is unmapped once no view made
   * from it is open (yours included), after which the sender is told (its lease ends). Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const errors: unknown[] = [];
    const closeQuietly = (c: { close(): void }) => {
      try {
        c.close();
      } catch (e) {
        errors.push(e);
      }
    };
    if (this.#received) {
      for (const v of this.#views ?? []) if (v) closeQuietly(v);
      for (const a of this.#received.allocations) closeQuietly(a);
    } else {
      for (const a of this.#entries!.values()) closeQuietly(a);
    }
    this.#cache.clear();
    if (errors.length) throw errors[0];
  }

  /** Same as close(). */
  [Symbol.dispose](): void { this.close(); }

  static {
    tensorMapContents = (map) => {
      if (map.#closed) throw closedError();
      return map.#received
        ? { kind: 'received', received: map.#received }
        : { kind: 'built', entries: map.#entries!, version: map.#version, cache: map.#cache };
    };
    setTensorMapMetadata = (map, metadata) => { map.#metadata = Object.freeze({ ...metadata }); };
    receivedTensorMap = (received) => {
      const map = new TensorMap();
      map.#entries = undefined;
      map.#received = received;
      return map;
    };
  }
}
