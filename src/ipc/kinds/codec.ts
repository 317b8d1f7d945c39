// The contract each descriptor kind implements, so the envelope code (descriptor.ts) stays
// generic: adding a kind means one codec module and one row in the codec table.

import type { Field } from '../checks.js';
import type { DescriptorJsonOf, DescriptorKind, DescriptorOf } from '../descriptor-types.js';
import type { WireReader, WireWriter } from '../wire.js';

export interface KindCodec<K extends DescriptorKind> {
  readonly kind: K;
  /** Type tag in the binary header. Never reuse a retired tag. */
  readonly typeTag: number;
  /** Checks an in-memory descriptor (bytes as Uint8Array) whose kind and version are already
   *  checked, and returns a normalised copy sharing no buffers with the input. */
  check(obj: Record<string, unknown>, field: Field): DescriptorOf<K>;
  /** Checks the JSON form (plain object; kind and version already checked), rejecting unknown keys. */
  fromJson(obj: Record<string, unknown>, field: Field): DescriptorOf<K>;
  toJson(desc: DescriptorOf<K>): DescriptorJsonOf<K>;
  /** Bytes of the body, which follows the common 16-byte header. */
  bodyLength(desc: DescriptorOf<K>): number;
  encodeBody(desc: DescriptorOf<K>, out: WireWriter): void;
  /** Reads and checks the body; the caller checks that nothing trails it. */
  decodeBody(input: WireReader): DescriptorOf<K>;
}
