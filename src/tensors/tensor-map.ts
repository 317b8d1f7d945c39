// TensorMap: named tensors (DeviceArrays or HostArrays), the value a tensor set is sent as and
// received as. A map you build holds your arrays; a received map holds the allocations the
// message brought (one mapping each) and makes each named tensor, a view into them, on first use.
// Either way the map owns what it holds: close() closes every array it handed out, and for a
// received map that is when its memory is unmapped and the sender's lease ends.
import type { DeviceBuffer } from '../cuda/buffer.js';
import type { Device } from '../cuda/device.js';
import { IpcError } from '../errors.js';
import { HostBuffer } from '../host/host-buffer.js';
import { DeviceArray } from '../arrays/device-array.js';
import { dtypeInfo } from '../ipc/dtype.js';
import { HostArray } from '../arrays/host-array.js';
import type { TensorLayout } from './wire.js';
import { invalidArgType } from '../arg-errors.js';

/** A tensor of a TensorMap: a typed view of device memory or of shared host memory. */
export type TensorArray = DeviceArray | HostArray;

/** Whether `v` travels as a tensor set: a TensorMap, or a non-empty Map of names to DeviceArrays / HostArrays. */
export function isTensorSetValue(v: unknown): v is TensorMap | Map<string, TensorArray> {
  if (v instanceof TensorMap) return true;
  if (!(v instanceof Map) || v.size === 0) return false;
  for (const [k, a] of v) if (typeof k !== 'string' || !(a instanceof DeviceArray || a instanceof HostArray)) return false;
  return true;
}

/** Where a map's tensors live: 'mixed' when some are on a device and some in host memory. */
export type TensorMemory = 'device' | 'host' | 'mixed';

/** @internal What a received map is made of (for the transfer handler and in-place updates). */
export interface ReceivedTensors {
  readonly layout: TensorLayout;
  /** One buffer per allocation, over all of it, in the layout's allocation order. */
  readonly allocations: ReadonlyArray<DeviceBuffer | HostBuffer>;
}

/**
 * @internal A set received over a TCP link whose bytes are still on the sender (PROTOCOL.md 8.3):
 * its table now, its bytes when asked (nccl-transfer.ts).
 */
export interface RemoteTensors {
  readonly layout: TensorLayout;
  /** The device the bytes land on (the link's working device). */
  readonly device: Device;
  /** Receives the whole set into one allocation of this process's own, laid out as the table says. */
  fetch(): Promise<DeviceBuffer>;
  /**
   * Receives the set straight into `targets` (per tensor of the layout: the address of a
   * C-contiguous destination on `device`, or undefined to drop its bytes). Resolves once there.
   */
  receiveInto(targets: ReadonlyArray<bigint | undefined>): Promise<{ operations: number; staged: number }>;
  /** Nobody will use it: its bytes are received and dropped (the sender needs the transfer to end), or the memory fetch() made is freed. */
  drop(): void;
  /** fetch() ran (maybe forced: a later transfer on its communicator needed the way). */
  readonly fetchStarted: boolean;
}

/** @internal A map's contents for the transfer handler: what it was built from, or received as. */
export let tensorMapContents: (map: TensorMap) =>
  | { kind: 'built'; entries: ReadonlyMap<string, TensorArray>; version: number; cache: Map<string, unknown> }
  | { kind: 'received'; received: ReceivedTensors }
  | { kind: 'remote'; remote: RemoteTensors };
/** @internal A map over received allocations (the transfer handler's result). */
export let receivedTensorMap: (received: ReceivedTensors) => TensorMap;
/** @internal A map whose bytes are still on the sender (nccl-transfer.ts). */
export let remoteTensorMap: (remote: RemoteTensors) => TensorMap;
/** @internal A remote map's bytes went straight into someone's tensors (updateInPlace): it holds none. */
export let consumeRemote: (map: TensorMap) => void;
/** @internal Sets what `metadata` returns (loadSafetensors: the files' __metadata__). */
export let setTensorMapMetadata: (map: TensorMap, metadata: Readonly<Record<string, string>>) => void;

function pendingError(): IpcError {
  return new IpcError('ERR_INVALID_STATE',
    "this TensorMap came over a TCP link and its bytes are still on the sender: `await map.fetch()` receives them into memory of " +
    "this process, or `await updateInPlace(params, map)` receives them straight into your tensors");
}

function consumedError(): IpcError {
  return new IpcError('ERR_INVALID_STATE', 'this TensorMap was received straight into your tensors by updateInPlace: it holds no bytes of its own');
}

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
  /** A set whose bytes are still on the sender; 'consumed' once they went straight into someone's tensors. */
  #remote: RemoteTensors | 'consumed' | undefined;
  #fetching: Promise<void> | undefined;
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
    return this.#layout ? this.#layout.count : this.#entries!.size;
  }

  /** The table of a received map (over a Unix link, or over a TCP link, fetched or not). */
  get #layout(): TensorLayout | undefined {
    return this.#received?.layout ?? this.#remoteLayout;
  }
  #remoteLayout: TensorLayout | undefined;

  /**
   * True while the map came over a TCP link and its bytes are still on the sender: `fetch()` brings
   * them into memory of this process, `updateInPlace(params, map)` straight into your tensors.
   */
  get pending(): boolean {
    return this.#remote !== undefined && this.#remote !== 'consumed' && !this.#received;
  }

  /**
   * Receives a map that came over a TCP link into one allocation of this process's own (on the
   * link's working device); resolves with the map, whose tensors `get()` then gives. At once for
   * any other map. Rejects with the transfer's error (the link closed, NCCL failed).
   */
  async fetch(): Promise<this> {
    if (this.#closed) throw closedError();
    if (this.#remote === 'consumed') throw consumedError();
    if (!this.#remote || this.#received) return this;
    const remote = this.#remote;
    this.#fetching ??= remote.fetch().then((buffer) => {
      if (this.#closed) {
        buffer.close();
        throw closedError();
      }
      this.#received = { layout: remote.layout, allocations: [buffer] };
    });
    await this.#fetching;
    return this;
  }

  get closed(): boolean { return this.#closed; }

  /** Free-form string metadata: the `__metadata__` of a loaded safetensors checkpoint; empty otherwise (it does not travel). */
  get metadata(): Readonly<Record<string, string>> { return this.#metadata; }

  /** True for a map that arrived over a link (its tensors are views into the sender's memory, or over a TCP link copies of them). */
  get received(): boolean { return this.#received !== undefined || this.#remote !== undefined; }

  /** Where the tensors live; undefined for an empty map. */
  get memory(): TensorMemory | undefined {
    let device = false;
    let host = false;
    if (this.#received) {
      for (const a of this.#received.allocations) (a instanceof HostBuffer ? (host = true) : (device = true));
    } else if (this.#remote) {
      device = true;
    } else {
      for (const a of this.#entries!.values()) (a instanceof HostArray ? (host = true) : (device = true));
    }
    return device && host ? 'mixed' : device ? 'device' : host ? 'host' : undefined;
  }

  /** Bytes of all tensors' elements together. */
  get byteLength(): number {
    let n = 0;
    const layout = this.#layout;
    if (layout) for (const b of layout.nbytes) n += b;
    else for (const a of this.#entries!.values()) n += a.size * dtypeInfo(a.dtype).itemsize;
    return n;
  }

  /** Whether the map has a tensor of that name. */
  has(name: string): boolean {
    const layout = this.#layout;
    return layout ? layout.index.has(name) : this.#entries!.has(name);
  }

  /** The tensor called `name` (for a received map, a view made on first use and kept). */
  get(name: string): A | undefined {
    if (this.#closed) throw closedError();
    if (!this.#received) {
      if (this.#remote === 'consumed') throw consumedError();
      if (this.#remote) throw pendingError();
      return this.#entries!.get(name);
    }
    const i = this.#received.layout.index.get(name);
    return i === undefined ? undefined : this.#view(i);
  }

  /** Adds or replaces a tensor (maps you built only; a received map is the sender's and read-only). */
  set(name: string, array: A): this {
    if (this.#closed) throw closedError();
    if (this.#received || this.#remote) throw new IpcError('ERR_INVALID_STATE', 'a received TensorMap is read-only; build a new TensorMap (or copy with updateInPlace) to change tensors');
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
    if (this.#received || this.#remote) throw new IpcError('ERR_INVALID_STATE', 'a received TensorMap is read-only');
    const had = this.#entries!.delete(name);
    if (had) this.#version++;
    return had;
  }

  /** Tensor names, in the map's order (the sender's order for a received map). */
  *keys(): IterableIterator<string> {
    const layout = this.#layout;
    if (layout) yield* layout.names;
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
      if (this.#remote === 'consumed') throw consumedError();
      if (this.#remote) throw pendingError();
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
    } else if (this.#remote && this.#remote !== 'consumed') {
      // Never used: its bytes must still be taken off the wire for the sender's transfer to end.
      this.#remote.drop();
    } else if (!this.#remote) {
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
      if (map.#received) return { kind: 'received', received: map.#received };
      if (map.#remote === 'consumed') throw consumedError();
      if (map.#remote) {
        if (map.#fetching) throw new IpcError('ERR_INVALID_STATE', 'this TensorMap is being fetched; await map.fetch() first');
        return { kind: 'remote', remote: map.#remote };
      }
      return { kind: 'built', entries: map.#entries!, version: map.#version, cache: map.#cache };
    };
    consumeRemote = (map) => {
      map.#remote = 'consumed';
    };
    remoteTensorMap = (remote) => {
      const map = new TensorMap();
      map.#entries = undefined;
      map.#remote = remote;
      map.#remoteLayout = remote.layout;
      return map;
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
