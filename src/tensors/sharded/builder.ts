// Building a rank's layout without writing boxes by hand: a box (or a whole tensor), placements
// as a DTensor has them (Shard(d) / Replicate on a mesh), an array's own dtype, shape and strides
// (DeviceArray, HostArray), and destination parameters made of pieces of several global tensors
// (fused qkv, gate_up) split for tensor parallelism, padded (a vocabulary to a multiple of 64).
import { dtypeInfo, type DType } from '../../ipc/dtype.js';
import { LayoutError, type Box } from './errors.js';
import { compareNames, contiguousStrides, validateLayout, type GlobalTensor, type LocalTensor, type Piece, type RankLayout } from './layout.js';
import { placementBox, placementPieces, shardRange, type Placement } from './placements.js';
import { volume } from './box.js';

/** A box of a global tensor (the whole tensor when start and length are left out). */
export interface BoxSpec {
  readonly dtype: DType;
  /** The global tensor's shape. */
  readonly shape: readonly number[];
  readonly start?: readonly number[];
  readonly length?: readonly number[];
  /** Byte strides of the local tensor (C-contiguous when left out). */
  readonly strides?: readonly number[];
  /** The global tensor's name when it differs from the local tensor's. */
  readonly tensor?: string;
}

/** A DTensor's way: the box follows from the mesh, the placements and this rank's coordinate. */
export interface PlacedSpec {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly mesh: readonly number[];
  readonly placements: readonly Placement[];
  readonly coordinate: readonly number[];
  readonly strides?: readonly number[];
  readonly tensor?: string;
}

/** What a layout needs of an array: DeviceArray and HostArray have these (strides in bytes). */
export interface ArrayLikeTensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly strides?: readonly number[];
}

/** A local tensor made of pieces of global tensors, the rest padding. */
export interface ParameterSpec {
  readonly dtype: DType;
  /** The local tensor's shape. */
  readonly shape: readonly number[];
  readonly strides?: readonly number[];
  readonly pieces: ReadonlyArray<{
    readonly tensor: string;
    /** The global tensor's shape. */
    readonly shape: readonly number[];
    readonly start: readonly number[];
    readonly length: readonly number[];
    /** Where the piece starts in the local tensor (zeros when left out). */
    readonly at?: readonly number[];
  }>;
  readonly padding?: readonly Box[];
}

/** A tensor-parallel parameter: each part split along `dim`, the rank's chunks concatenated. */
export interface TensorParallelSpec {
  readonly dtype: DType;
  /** The global tensors fused into the parameter, in order (q, k, v; gate, up); one for a plain split. */
  readonly parts: ReadonlyArray<{ readonly tensor: string; readonly shape: readonly number[] }>;
  /** The dimension split (0: column parallel, 1: row parallel) and along which parts are concatenated. */
  readonly dim: number;
  /** Tensor-parallel size and this rank's index in it. */
  readonly size: number;
  readonly rank: number;
  /** Each part's extent along `dim` is padded up to a multiple of this before the split (64 for a vocabulary). */
  readonly padMultiple?: number;
}

/**
 * The parameter a tensor-parallel rank holds: each part's extent along `dim` (padded up to
 * `padMultiple`) cut by torch.chunk's rule (equal chunks where it divides, as vLLM requires), the
 * chunks concatenated along `dim`; rows past a part's real extent are padding.
 */
export function tensorParallelParameter(spec: TensorParallelSpec): ParameterSpec {
  const { parts, dim, size, rank } = spec;
  const first = parts[0]?.shape;
  if (!first || dim < 0 || dim >= first.length || !(size >= 1) || !(rank >= 0 && rank < size)) {
    throw new LayoutError('ERR_LAYOUT_INVALID', `tensorParallelParameter: give at least one part, dim within its dimensions and 0 <= rank < size (dim ${dim}, rank ${rank}, size ${size})`);
  }
  const pieces: Array<ParameterSpec['pieces'][number]> = [];
  const padding: Box[] = [];
  const zeros = first.map(() => 0);
  let offset = 0;
  for (const part of parts) {
    if (part.shape.length !== first.length || part.shape.some((n, i) => i !== dim && n !== first[i])) {
      throw new LayoutError('ERR_LAYOUT_SHAPE', `tensorParallelParameter: ${part.tensor} [${part.shape.join(', ')}] cannot be concatenated with [${first.join(', ')}] along dimension ${dim}`, { tensor: part.tensor });
    }
    const n = part.shape[dim]!;
    const padded = spec.padMultiple ? Math.ceil(n / spec.padMultiple) * spec.padMultiple : n;
    const [c0, cl] = shardRange(padded, size, rank);
    const real = Math.max(0, Math.min(c0 + cl, n) - c0);
    if (real > 0) {
      const start = [...zeros]; start[dim] = c0;
      const length = [...part.shape]; length[dim] = real;
      const at = [...zeros]; at[dim] = offset;
      pieces.push({ tensor: part.tensor, shape: part.shape, start, length, at });
    }
    if (cl > real) {
      const start = [...zeros]; start[dim] = offset + real;
      const length = [...part.shape]; length[dim] = cl - real;
      padding.push({ start, length });
    }
    offset += cl;
  }
  const shape = [...first]; shape[dim] = offset;
  return { dtype: spec.dtype, shape, pieces, padding };
}

/** Builds one rank's layout; build() checks it (validateLayout) and returns it. */
export class LayoutBuilder {
  readonly #rank: { rank: number; node: string; gpu: number };
  readonly #globals = new Map<string, GlobalTensor>();
  readonly #sources: LocalTensor[] = [];
  readonly #destinations: LocalTensor[] = [];

  constructor(rank: { rank: number; node: string; gpu: number }) {
    this.#rank = { rank: rank.rank, node: rank.node, gpu: rank.gpu };
  }

  /** This rank sends from local tensor `name`: a box of a global tensor, or its DTensor placements. */
  hold(name: string, spec: BoxSpec | PlacedSpec): this {
    return this.#plain(this.#sources, name, spec);
  }

  /** This rank receives into local tensor `name`: a box of a global tensor, or placements. */
  need(name: string, spec: BoxSpec | PlacedSpec): this {
    return this.#plain(this.#destinations, name, spec);
  }

  /** `hold` for an array (DeviceArray, HostArray): its dtype, shape and strides; the box at `start` of a global tensor of `shape`. */
  holdArray(name: string, array: ArrayLikeTensor, where: { shape: readonly number[]; start?: readonly number[]; tensor?: string }): this {
    return this.hold(name, { ...arrayBox(array, where) });
  }

  /** `need` for an array (DeviceArray, HostArray). */
  needArray(name: string, array: ArrayLikeTensor, where: { shape: readonly number[]; start?: readonly number[]; tensor?: string }): this {
    return this.need(name, { ...arrayBox(array, where) });
  }

  /** A source local tensor made of pieces of several global tensors (a trainer's fused parameter). */
  holdParameter(name: string, spec: ParameterSpec): this {
    return this.#parameter(this.#sources, name, spec);
  }

  /** A destination parameter made of pieces (fused qkv, gate_up), the rest declared padding. */
  needParameter(name: string, spec: ParameterSpec): this {
    return this.#parameter(this.#destinations, name, spec);
  }

  /** The layout, checked (throws LayoutError). */
  build(): RankLayout {
    const tensors = [...this.#globals.values()].sort((a, b) => compareNames(a.name, b.name));
    const layout: RankLayout = { ...this.#rank, tensors, sources: [...this.#sources], destinations: [...this.#destinations] };
    validateLayout(layout);
    return layout;
  }

  #plain(list: LocalTensor[], name: string, spec: BoxSpec | PlacedSpec): this {
    const tensor = spec.tensor ?? name;
    if ('placements' in spec && spec.placements.some((p) => p !== 'replicate' && p?.splitFactor !== undefined)) {
      // Strided shards: the local tensor is several boxes of the global one, each at its offset.
      const { shape, pieces } = placementPieces(spec, name);
      if (pieces.length === 0) return this;
      return this.#parameter(list, name, {
        dtype: spec.dtype, shape, ...(spec.strides && { strides: spec.strides }),
        pieces: pieces.map((p) => ({ tensor, shape: spec.shape, ...p })),
      });
    }
    const box = 'placements' in spec ? placementBox(spec, name) : { start: spec.start ?? spec.shape.map(() => 0), length: spec.length ?? [...spec.shape] };
    if (volume(box.length) === 0) return this; // an empty shard: nothing to send or receive
    return this.#parameter(list, name, {
      dtype: spec.dtype, shape: box.length, ...(spec.strides && { strides: spec.strides }),
      pieces: [{ tensor, shape: spec.shape, start: box.start, length: box.length }],
    });
  }

  #parameter(list: LocalTensor[], name: string, spec: ParameterSpec): this {
    if (volume(spec.shape) === 0) return this;
    const pieces: Piece[] = [];
    for (const p of spec.pieces) {
      const known = this.#globals.get(p.tensor);
      if (known && (known.dtype !== spec.dtype || known.shape.length !== p.shape.length || known.shape.some((n, i) => n !== p.shape[i]))) {
        const code = known.dtype !== spec.dtype ? 'ERR_LAYOUT_DTYPE' : 'ERR_LAYOUT_SHAPE';
        throw new LayoutError(code, `rank ${this.#rank.rank}: ${p.tensor} is ${spec.dtype} [${p.shape.join(', ')}] in ${name} but ${known.dtype} [${known.shape.join(', ')}] elsewhere in this layout`, { tensor: p.tensor, rank: this.#rank.rank });
      }
      if (!known) this.#globals.set(p.tensor, { name: p.tensor, dtype: spec.dtype, shape: [...p.shape] });
      pieces.push({ tensor: p.tensor, start: [...p.start], length: [...p.length], at: p.at ? [...p.at] : p.start.map(() => 0) });
    }
    const strides = spec.strides ? [...spec.strides] : contiguousStrides(spec.shape, dtypeInfo(spec.dtype).itemsize);
    list.push({ name, dtype: spec.dtype, shape: [...spec.shape], strides, pieces, padding: (spec.padding ?? []).map((b) => ({ start: [...b.start], length: [...b.length] })) });
    return this;
  }
}

function arrayBox(array: ArrayLikeTensor, where: { shape: readonly number[]; start?: readonly number[]; tensor?: string }): BoxSpec {
  return {
    dtype: array.dtype, shape: where.shape, start: where.start ?? where.shape.map(() => 0), length: [...array.shape],
    ...(array.strides && { strides: array.strides }), ...(where.tensor !== undefined && { tensor: where.tensor }),
  };
}
