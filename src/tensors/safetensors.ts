// The safetensors format, read as hostile input: an 8-byte little-endian header length, a JSON
// header mapping tensor names to { dtype, shape, data_offsets: [begin, end) } (relative to the data
// section that follows) plus an optional "__metadata__" map of strings, then the data, little-
// endian. Checked: the header length against the file (and the reference implementation's 100 MB
// limit), the JSON (an object starting with '{'), every dtype, shape and range, each range's size
// against shape x itemsize, and the ranges tiling the data section exactly (sorted, no gap, no
// overlap, to its end). A failure is ERR_SAFETENSORS_INVALID naming the file and the tensor. The
// format does not align tensors (the reference writer packs them back to back, so whatever follows
// an odd-length U8 tensor is misaligned): loadSafetensors places each one aligned in memory. Also a
// writer, for tests and examples. Pure but for file reads.
import { openRegularFileHandle, writeFileAtomic } from '../safe-files.js';
import { IpcError } from '../errors.js';
import { dtypeInfo, type DType } from '../ipc/dtype.js';
import { invalidArgValue } from '../arg-errors.js';

/** The reference implementation's limit on the header. */
export const MAX_HEADER_BYTES = 100_000_000;

/** safetensors dtype names and ours. */
export const SAFETENSORS_DTYPES: Readonly<Record<string, DType>> = {
  BOOL: 'bool', U8: 'uint8', I8: 'int8', U16: 'uint16', I16: 'int16', U32: 'uint32', I32: 'int32', U64: 'uint64', I64: 'int64',
  F16: 'float16', BF16: 'bfloat16', F32: 'float32', F64: 'float64', F8_E4M3: 'float8_e4m3fn', F8_E5M2: 'float8_e5m2',
};
const NAME_OF: Readonly<Record<string, string>> = Object.fromEntries(Object.entries(SAFETENSORS_DTYPES).map(([k, v]) => [v, k]));

/** One tensor of a safetensors header. */
export interface SafetensorsEntry {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** [begin, end) in the data section. */
  readonly begin: number;
  readonly end: number;
}

/** A checked safetensors header (readSafetensorsHeader()). */
export interface SafetensorsHeader {
  /** The file, for messages. */
  readonly path: string;
  /** Where the data section starts in the file (8 + header length). */
  readonly dataOffset: number;
  readonly dataBytes: number;
  readonly metadata: Readonly<Record<string, string>>;
  /** The tensors in header order. */
  readonly tensors: readonly SafetensorsEntry[];
}

function invalid(path: string, why: string): IpcError {
  return new IpcError('ERR_SAFETENSORS_INVALID', `${path}: ${why}`);
}

function quoted(name: string): string {
  return JSON.stringify(name.length > 80 ? name.slice(0, 80) + '...' : name);
}

/** The header length the first 8 bytes announce, checked against the file size. */
export function headerLength(first8: Uint8Array, fileSize: number, path = 'safetensors file'): number {
  if (fileSize < 8 || first8.byteLength < 8) throw invalid(path, `the file has ${fileSize} bytes, fewer than the 8 of the header length`);
  const v = new DataView(first8.buffer, first8.byteOffset, 8);
  const high = v.getUint32(4, true);
  const n = high * 0x1_0000_0000 + v.getUint32(0, true);
  if (high >= 0x20_0000 || n > MAX_HEADER_BYTES) throw invalid(path, `the header length ${high >= 0x20_0000 ? 'is beyond 2^53' : n} is more than the ${MAX_HEADER_BYTES} bytes a header may have`);
  if (n < 2) throw invalid(path, `the header length ${n} is too small for a JSON object`);
  if (8 + n > fileSize) throw invalid(path, `the header of ${n} bytes runs past the end of the ${fileSize}-byte file`);
  return n;
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Parses and checks a header: `json` is the header's bytes (after the 8-byte length), `fileSize` the
 * whole file's size.
 */
export function parseSafetensorsHeader(json: Uint8Array, fileSize: number, path = 'safetensors file'): SafetensorsHeader {
  const dataOffset = 8 + json.byteLength;
  if (json[0] !== 0x7b) throw invalid(path, 'the header does not start with "{"');
  let text: string;
  try {
    text = strictUtf8.decode(json);
  } catch {
    throw invalid(path, 'the header is not UTF-8');
  }
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (e) {
    throw invalid(path, `the header is not JSON (${(e as Error).message})`);
  }
  if (typeof root !== 'object' || root === null || Array.isArray(root)) throw invalid(path, 'the header is not a JSON object');
  const dataBytes = fileSize - dataOffset;
  let metadata: Record<string, string> = {};
  const tensors: SafetensorsEntry[] = [];
  for (const [name, value] of Object.entries(root as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) throw invalid(path, '"__metadata__" must be an object of strings');
      for (const [k, v] of Object.entries(value)) if (typeof v !== 'string') throw invalid(path, `"__metadata__" entry ${quoted(k)} is not a string`);
      metadata = { ...(value as Record<string, string>) };
      continue;
    }
    const bad = (why: string): never => { throw invalid(path, `tensor ${quoted(name)} ${why}`); };
    if (typeof value !== 'object' || value === null || Array.isArray(value)) bad('is not an object with dtype, shape and data_offsets');
    const entry = value as Record<string, unknown>;
    for (const k of Object.keys(entry)) if (k !== 'dtype' && k !== 'shape' && k !== 'data_offsets') bad(`has an unknown field ${quoted(k)}`);
    const dtype = typeof entry.dtype === 'string' ? SAFETENSORS_DTYPES[entry.dtype] : undefined;
    if (!dtype || !Object.hasOwn(SAFETENSORS_DTYPES, entry.dtype as string)) {
      bad(`has dtype ${JSON.stringify(entry.dtype)}; supported: ${Object.keys(SAFETENSORS_DTYPES).join(', ')}`);
    }
    if (!Array.isArray(entry.shape)) bad('has no shape array');
    const shape = entry.shape as unknown[];
    if (shape.length > 32) bad(`has ${shape.length} dimensions (at most 32)`);
    let elements = 1;
    for (const d of shape) {
      if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 0) bad(`has a bad shape ${JSON.stringify(shape)}`);
      elements *= d as number;
      if (!Number.isSafeInteger(elements)) bad('has more than 2^53-1 elements');
    }
    const offsets = entry.data_offsets;
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => typeof o === 'number' && Number.isSafeInteger(o) && o >= 0)) {
      bad(`has data_offsets ${JSON.stringify(offsets)}, not [begin, end] with non-negative integers`);
    }
    const [begin, end] = offsets as [number, number];
    if (end < begin) bad(`has data_offsets [${begin}, ${end}] that end before they begin`);
    if (end > dataBytes) bad(`has data_offsets [${begin}, ${end}] past the end of the data (${dataBytes} bytes); the file is truncated or the header lies`);
    const { itemsize } = dtypeInfo(dtype!);
    if (end - begin !== elements * itemsize) bad(`has ${end - begin} bytes of data, but shape ${JSON.stringify(shape)} of ${entry.dtype} needs ${elements * itemsize}`);
    tensors.push({ name, dtype: dtype!, shape: shape as number[], begin, end });
  }
  // The ranges must tile the data section: sorted, no gap, no overlap, to its end.
  const sorted = [...tensors].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let at = 0;
  for (const t of sorted) {
    if (t.begin !== at) {
      throw invalid(path, t.begin < at ? `tensor ${quoted(t.name)} overlaps the tensor before it (it begins at ${t.begin}, before ${at})` : `bytes ${at}..${t.begin} of the data belong to no tensor (before ${quoted(t.name)})`);
    }
    at = t.end;
  }
  if (at !== dataBytes) throw invalid(path, `the tensors cover ${at} bytes of data but the file has ${dataBytes} after the header`);
  return { path, dataOffset, dataBytes, metadata, tensors };
}

/** Reads and checks the header of a file (two reads: the length, then the header). */
export async function readSafetensorsHeader(path: string): Promise<SafetensorsHeader> {
  const fh = await openRegularFileHandle(path, 'the safetensors file');
  try {
    const { size } = await fh.stat();
    const first = new Uint8Array(8);
    await fh.read(first, 0, Math.min(8, size), 0);
    const n = headerLength(first, size, path);
    const json = new Uint8Array(n);
    const { bytesRead } = await fh.read(json, 0, n, 8);
    if (bytesRead !== n) throw invalid(path, `read ${bytesRead} of the header's ${n} bytes`);
    return parseSafetensorsHeader(json, size, path);
  } finally {
    await fh.close();
  }
}

/** A tensor to write: its values' bytes (little-endian, C order). */
export interface SafetensorsInput {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly data: ArrayBufferView;
}

/**
 * The bytes of a safetensors file holding `tensors` in the given order, data packed back to back
 * in that order as the reference writer does (order larger elements first to keep every tensor
 * aligned in the file; loadSafetensors aligns them in memory either way), with the header padded
 * with spaces so that the data starts 8-byte aligned.
 */
export function safetensorsBytes(tensors: Iterable<readonly [string, SafetensorsInput]>, metadata?: Readonly<Record<string, string>>): { header: Uint8Array; chunks: Uint8Array[] } {
  const head: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length) head.__metadata__ = metadata;
  const chunks: Uint8Array[] = [];
  let at = 0;
  for (const [name, t] of tensors) {
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    const n = t.shape.reduce((a, b) => a * b, 1) * dtypeInfo(t.dtype).itemsize;
    if (bytes.byteLength !== n) throw invalidArgValue(`tensor ${quoted(name)}: ${bytes.byteLength} bytes of data for shape [${t.shape}] of ${t.dtype} (${n} needed)`);
    head[name] = { dtype: NAME_OF[t.dtype], shape: t.shape, data_offsets: [at, at + n] };
    chunks.push(bytes);
    at += n;
  }
  let json = Buffer.from(JSON.stringify(head), 'utf8');
  const padded = (json.byteLength + 7) & ~7;
  json = Buffer.concat([json, Buffer.alloc(padded - json.byteLength, 0x20)]);
  const header = new Uint8Array(8 + json.byteLength);
  new DataView(header.buffer).setBigUint64(0, BigInt(json.byteLength), true);
  header.set(json, 8);
  return { header, chunks };
}

/**
 * Writes a safetensors file (synchronously; for tests, examples and small checkpoints): into a new
 * temporary beside `path`, then given the name `path`, so that a reader never sees half a file. A
 * regular file of this user at `path` is replaced; anything else there (a symlink, a FIFO, a
 * device, a directory, another user's file) is left as it is: ERR_FILE_UNSAFE.
 */
export function writeSafetensors(path: string, tensors: Iterable<readonly [string, SafetensorsInput]>, metadata?: Readonly<Record<string, string>>): void {
  const { header, chunks } = safetensorsBytes(tensors, metadata);
  writeFileAtomic(path, [header, ...chunks], { mode: 0o666, replace: 'own-regular-file', what: 'the safetensors file' });
}
