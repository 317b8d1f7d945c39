"""The channel control block, layout version 4 (docs/channel-protocol.md section 3; the Node side
is src/channel/layout.ts): constants, offsets, and the checks of a received block's header.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import IpcError

MAGIC = 0x4C4E4843
VERSION = 4
HEADER_BYTES = 320
PARTICIPANT_BYTES = 64
SLOT_HEADER_BYTES = 64
FLAG_DEVICE = 1
FLAG_BROADCAST = 2

# Header words.
H_MAGIC, H_VERSION, H_HEADER_BYTES, H_FLAGS, H_SLOT_COUNT, H_SLOT_BYTES = 0, 4, 6, 8, 12, 16
H_META_BYTES, H_MAX_PARTICIPANTS, H_PARTICIPANTS_OFFSET, H_RING_OFFSET = 24, 28, 32, 36
H_SLOT_RECORDS_OFFSET, H_SLOT_RECORD_BYTES, H_TOTAL_BYTES = 40, 44, 48
H_EXPECT_PRODUCERS, H_EXPECT_CONSUMERS = 56, 60
# The publish line (64), the take line (128), the counters (192), the space line (256).
H_TAIL, H_LOCK, H_DATA_SEQ, H_DATA_SLEEPERS, H_CONSUMER_MASK = 64, 72, 76, 80, 84
H_HEAD = 128
H_PRODUCERS_ATTACHED, H_PRODUCERS_LIVE, H_PRODUCERS_DIED = 192, 196, 200
H_CONSUMERS_ATTACHED, H_CONSUMERS_LIVE, H_CONSUMERS_DIED = 204, 208, 212
H_FENCES_OFFSET = 220
H_SPACE_SEQ, H_SPACE_SLEEPERS = 256, 260
_RESERVED = ((88, 128), (136, 192), (216, 220), (224, 256), (264, 320))

# Participant entry fields.
P_STATE, P_ROLE, P_PID, P_FLAGS, P_CURSOR, P_GENERATION = 0, 4, 8, 12, 16, 24
PFLAG_HUB_LOCAL = 1
ST_EMPTY, ST_ALIVE, ST_ENDED, ST_DEAD, ST_RECOVERING = 0, 1, 2, 3, 4
ROLE_PRODUCER, ROLE_CONSUMER, ROLE_HUB = 1, 2, 3

# Slot record fields.
S_STATE, S_HOLDERS, S_POSITION, S_LENGTH, S_META_LENGTH, S_META_KIND = 0, 4, 8, 16, 24, 28
S_PUBLISHER, S_LAST_HOLDERS, S_DELIVERIES, S_TICKET, S_RELEASED_BY, S_RELEASE_TICKET, S_META = 32, 36, 40, 44, 48, 52, 64
KIND_FREE, KIND_WRITING, KIND_PUBLISHED, KIND_TAKEN = 0, 1, 2, 3
FLAG_REDELIVERED = 1 << 16
GEN_SHIFT = 17
GEN_MASK = 0x7FFF << GEN_SHIFT
META_NONE, META_JSON, META_BYTES = 0, 1, 2

MAX_SLOTS = 65536
MAX_DEVICE_SLOTS = 4096
MAX_META_BYTES = 65536
MIN_PARTICIPANTS = 2
MAX_PARTICIPANTS = 32


def gen_of(position: int) -> int:
    """The generation bits of a message published at ``position``."""
    return (position % 0x8000) << GEN_SHIFT


def slot_word(kind: int, owner: int, flags: int = 0) -> int:
    return (kind | (owner << 8) | flags) & 0xFFFFFFFF


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class Layout(NamedTuple):
    slot_count: int
    slot_bytes: int
    meta_bytes: int
    max_participants: int
    device: bool
    broadcast: bool
    participants_offset: int
    ring_offset: int
    slot_records_offset: int
    slot_record_bytes: int
    fences_offset: int
    release_fences_offset: int
    release_fence_row_bytes: int
    total_bytes: int
    expect_producers: int = 1
    expect_consumers: int = 1

    def publish_fence(self, s: int) -> int:
        return self.fences_offset + 4 * s

    def release_fence(self, s: int, k: int) -> int:
        return self.release_fences_offset + k * self.release_fence_row_bytes + 4 * s


def compute_layout(slot_count: int, slot_bytes: int, meta_bytes: int, max_participants: int, device: bool,
                   broadcast: bool, expect_producers: int = 1, expect_consumers: int = 1) -> Layout:
    participants = HEADER_BYTES
    ring = participants + max_participants * PARTICIPANT_BYTES
    records = ring + _round_up(slot_count * 4, 64)
    record_bytes = SLOT_HEADER_BYTES + _round_up(meta_bytes, 64)
    records_end = records + slot_count * record_bytes
    fence_row = _round_up(slot_count * 4, 64)
    fences = records_end if device else 0
    release_fences = records_end + fence_row if device else 0
    total = release_fences + max_participants * fence_row if device else records_end
    return Layout(slot_count, slot_bytes, meta_bytes, max_participants, device, broadcast, participants, ring, records,
                  record_bytes, fences, release_fences, fence_row if device else 0, total, expect_producers, expect_consumers)


def check_params(slot_count: int, slot_bytes: int, meta_bytes: int, max_participants: int, device: bool) -> str | None:
    """None when the parameters are in range, else what is wrong."""
    most = MAX_DEVICE_SLOTS if device else MAX_SLOTS
    if not 1 <= slot_count <= most:
        return f"slot count {slot_count} outside 1..{most}"
    if slot_bytes < 1 or slot_count * slot_bytes >= 2**53:
        return f"slot size {slot_bytes}"
    if not 0 <= meta_bytes <= MAX_META_BYTES or meta_bytes % 8:
        return f"meta bytes {meta_bytes}"
    if not MIN_PARTICIPANTS <= max_participants <= MAX_PARTICIPANTS:
        return f"{max_participants} participants"
    return None


def read_header(buf: memoryview, length: int) -> Layout:
    """Checks the header of a received block ``length`` bytes long: every field must match what its
    own parameters imply. Raises ERR_DESCRIPTOR_INVALID / ERR_DESCRIPTOR_VERSION."""
    def bad(what: str) -> IpcError:
        return IpcError("ERR_DESCRIPTOR_INVALID", f"received a channel control block that is not valid: {what}")

    if length < HEADER_BYTES:
        raise bad(f"{length} bytes, fewer than its {HEADER_BYTES}-byte header")
    def u32(off: int) -> int:
        v: int = struct.unpack_from("<I", buf, off)[0]
        return v

    def u64(off: int) -> int:
        v: int = struct.unpack_from("<Q", buf, off)[0]
        return v

    if u32(H_MAGIC) != MAGIC:
        raise bad("wrong magic number")
    version = struct.unpack_from("<H", buf, H_VERSION)[0]
    if version != VERSION:
        raise IpcError("ERR_DESCRIPTOR_VERSION", f"the peer's channel control block has layout version {version}; this cuda_ipc reads version {VERSION}: use the same cuda-ipc version on both sides")
    if struct.unpack_from("<H", buf, H_HEADER_BYTES)[0] != HEADER_BYTES:
        raise bad("header size")
    flags = u32(H_FLAGS)
    if flags & ~(FLAG_DEVICE | FLAG_BROADCAST):
        raise bad(f"unknown flags 0x{flags:x}")
    slot_count, slot_bytes, meta_bytes, max_p = u32(H_SLOT_COUNT), u64(H_SLOT_BYTES), u32(H_META_BYTES), u32(H_MAX_PARTICIPANTS)
    device, broadcast = bool(flags & FLAG_DEVICE), bool(flags & FLAG_BROADCAST)
    why = check_params(slot_count, slot_bytes, meta_bytes, max_p, device)
    if why:
        raise bad(why)
    l = compute_layout(slot_count, slot_bytes, meta_bytes, max_p, device, broadcast)
    for got, want, what in (
        (u32(H_PARTICIPANTS_OFFSET), l.participants_offset, "participants offset"),
        (u32(H_RING_OFFSET), l.ring_offset, "ring offset"),
        (u32(H_SLOT_RECORDS_OFFSET), l.slot_records_offset, "slot records offset"),
        (u32(H_SLOT_RECORD_BYTES), l.slot_record_bytes, "slot record size"),
        (u64(H_TOTAL_BYTES), l.total_bytes, "total size"),
        (u32(H_FENCES_OFFSET), l.fences_offset, "fences offset"),
    ):
        if got != want:
            raise bad(f"{what} {got}, expected {want}")
    if l.total_bytes > length:
        raise bad(f"it needs {l.total_bytes} bytes but the shared memory holds {length}")
    for a, b in _RESERVED:
        if any(buf[a:b]):
            raise bad(f"reserved header bytes at {a}..{b} are not zero")
    ep, ec = u32(H_EXPECT_PRODUCERS), u32(H_EXPECT_CONSUMERS)
    if not (1 <= ep <= max_p and 1 <= ec <= max_p):
        raise bad("membership fields")
    return l._replace(expect_producers=ep, expect_consumers=ec)


def read_participant(buf: memoryview, layout: Layout, k: int) -> tuple[int, int]:
    """(state, role) of participant entry ``k`` of a received block (before it is mapped for atomics)."""
    state, role = struct.unpack_from("<II", buf, layout.participants_offset + k * PARTICIPANT_BYTES + P_STATE)
    return state, role
