// Message payloads: what link.send(value) puts in a MESSAGE frame (message-encoder.ts) and how the
// receiver rebuilds it (message-decoder.ts). What both sides share of the format is here.
//
// Encodings (the frame's flags):
//   Raw:  `value` was a Uint8Array; the payload is its bytes (sent straight from the caller's
//         memory) and it arrives as a new Uint8Array.
//   Json: UTF-8 JSON of `value`; empty payload = undefined. The common, fast case.
//   JsonWithRecords: JSON in which every bigint, typed array and transferable object was replaced
//         by null, followed by one record per replaced value saying where it goes:
//           u32 jsonLength | json | u16 recordCount (>= 1) | record*
//           record = u8 kindLength (>= 1) | kind (ASCII) | u8 pathLength | segment* | u8 fdCount
//                    | u64 leaseId | u32 dataLength | data
//           segment = u8 0, u32 array index | u8 1, u16 keyLength, key (UTF-8)
//         The record's fds are the next fdCount of the frame's fds, in record order; the fd
//         counts add up to the frame's. leaseId (since frame version 2) is 0 when the value is
//         not leased, else 1..2^53-1, unique among the leases the receiver holds from this link;
//         the receiver returns it in a RELEASE frame once done with the value (lease.ts).
//         Every placement must point at a null in the JSON; nothing may follow the last record.
// Built-in record kinds: '@bigint' (ASCII decimal, no fds, no lease) and '@typed-array' (u8 type
// tag, then bytes; no fds, no lease). Anything out of spec is ERR_FRAME_INVALID and closes the link.

/** u8 fdCount, u64 leaseId, u32 dataLength: between a record's path and its data. */
export const RECORD_TAIL_BYTES = 13;
/** A step of a record's path: an array index or an object key. */
export type Segment = string | number;

/** Typed arrays the built-in '@typed-array' record carries, by wire tag. */
export const TYPED_ARRAYS = [
  undefined,
  Uint8Array,
  Int8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
] as const;
export const DATA_VIEW_TAG = TYPED_ARRAYS.length;

/** The '@typed-array' wire tag of `v`; 0 for a view the format does not carry. */
export function typedArrayTag(v: ArrayBufferView): number {
  if (v instanceof DataView) return DATA_VIEW_TAG;
  for (let i = 1; i < TYPED_ARRAYS.length; i++) if (v instanceof TYPED_ARRAYS[i]!) return i;
  return 0;
}
