// Little-endian cursor over untrusted bytes (WireReader) and over a buffer being encoded
// (WireWriter). Every read is bounds-checked and fails with ERR_DESCRIPTOR_INVALID naming the
// field, so decoders never throw RangeError or read past the input.

import { describe, fail, type Field } from './checks.js';

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

export class WireReader {
  private readonly view: DataView;
  private pos = 0;

  constructor(private readonly bytes: Uint8Array, private readonly what: string) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  get offset(): number {
    return this.pos;
  }

  get remaining(): number {
    return this.bytes.byteLength - this.pos;
  }

  private take(size: number, name: string): number {
    if (size > this.remaining) {
      fail(this.field(name), `is cut off: needs ${size} bytes at offset ${this.pos}, but the input has ${this.bytes.byteLength}`);
    }
    const at = this.pos;
    this.pos += size;
    return at;
  }

  /** The input as a whole, for checks that span several fields. */
  root(): Field {
    return { code: 'ERR_DESCRIPTOR_INVALID', path: this.what };
  }

  field(name: string): Field {
    return { code: 'ERR_DESCRIPTOR_INVALID', path: `${this.what}.${name}` };
  }

  u8(name: string): number {
    return this.view.getUint8(this.take(1, name));
  }

  u16(name: string): number {
    return this.view.getUint16(this.take(2, name), true);
  }

  u32(name: string): number {
    return this.view.getUint32(this.take(4, name), true);
  }

  /** An unsigned 64-bit field that must fit a safe integer. */
  u64Safe(name: string): number {
    const at = this.take(8, name);
    const high = this.view.getUint32(at + 4, true);
    if (high >= 0x20_0000) fail(this.field(name), `must be at most 2^53-1, got ${this.view.getBigUint64(at, true)}`);
    return high * 0x1_0000_0000 + this.view.getUint32(at, true);
  }

  /** A signed 64-bit field that must be a non-negative safe integer. */
  i64NonNegativeSafe(name: string, hint = ''): number {
    const value = this.view.getBigInt64(this.take(8, name), true);
    if (value < 0n || value > MAX_SAFE) fail(this.field(name), `must be in 0..2^53-1, got ${value}${hint}`);
    return Number(value);
  }

  /** The next `size` bytes, as a view of the input (for reading right away, not for keeping). */
  bytesView(size: number, name: string): Uint8Array {
    const at = this.take(size, name);
    return this.bytes.subarray(at, at + size);
  }

  /** A copy of the next `size` bytes. */
  bytesCopy(size: number, name: string): Uint8Array {
    const at = this.take(size, name);
    // Not bytes.slice(): on a Buffer that returns a view sharing memory with the input.
    return new Uint8Array(this.bytes.subarray(at, at + size));
  }

  /** Reserved or padding bytes, which must be zero so they can gain a meaning later. */
  zeros(size: number, name: string): void {
    const at = this.take(size, name);
    for (let i = at; i < at + size; i++) {
      if (this.bytes[i] !== 0) fail(this.field(name), `must be zero (reserved), got byte ${describe(this.bytes[i])} at offset ${i}`);
    }
  }

  /** Fails unless every byte has been read. */
  end(): void {
    if (this.remaining !== 0) {
      fail(this.field('length'), `has ${this.remaining} unexpected trailing bytes after offset ${this.pos}`);
    }
  }
}

export class WireWriter {
  readonly bytes: Uint8Array;
  private readonly view: DataView;
  private pos = 0;

  constructor(length: number) {
    this.bytes = new Uint8Array(length); // zero-filled: padding and reserved fields stay 0
    this.view = new DataView(this.bytes.buffer);
  }

  get offset(): number {
    return this.pos;
  }

  u8(value: number): void {
    this.view.setUint8(this.pos, value);
    this.pos += 1;
  }

  u16(value: number): void {
    this.view.setUint16(this.pos, value, true);
    this.pos += 2;
  }

  u32(value: number): void {
    this.view.setUint32(this.pos, value, true);
    this.pos += 4;
  }

  /** A non-negative safe integer (the codecs check their values first). */
  u64(value: number): void {
    this.view.setUint32(this.pos, value % 0x1_0000_0000, true);
    this.view.setUint32(this.pos + 4, Math.floor(value / 0x1_0000_0000), true);
    this.pos += 8;
  }

  i64(value: number): void {
    this.view.setBigInt64(this.pos, BigInt(value), true);
    this.pos += 8;
  }

  raw(bytes: Uint8Array): void {
    this.bytes.set(bytes, this.pos);
    this.pos += bytes.byteLength;
  }

  skip(size: number): void {
    this.pos += size;
  }

  /** The finished buffer; asserts the codec wrote exactly the length it announced. */
  finish(): Uint8Array {
    if (this.pos !== this.bytes.byteLength) {
      throw new Error(`cuda-ipc internal error: encoder wrote ${this.pos} of ${this.bytes.byteLength} bytes`);
    }
    return this.bytes;
  }
}
