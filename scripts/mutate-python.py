#!/usr/bin/env python3
"""Hand-written mutation testing of the Python twins of the checked modules (issue 41).

No mutation tool for Python is packaged by Debian (mutmut is on PyPI only), so this applies a
fixed list of textual mutations -- each the kind StrykerJS makes on the TypeScript side (a bound
moved by one, a check turned off) -- one at a time to a copy of python/ in a temporary directory,
and runs the unittest modules that cover the file. A mutant the tests do not fail "survived".

    python3 scripts/mutate-python.py            # every mutation
    python3 scripts/mutate-python.py nccl ring  # the mutations of the named groups

CUDA_IPC_MUTATE_WITHOUT=tests.a,tests.b leaves those test modules out (for a before-figure: the
score without the tests added for issue 41). Exits 1 when a mutant survives that is not marked equivalent (with its reason) below.
Runs at nice 10: it is long and machines are shared.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    group: str
    path: str  # under python/
    old: str  # occurs exactly once in the file
    new: str
    tests: tuple[str, ...]  # unittest modules (python/tests/...)
    equivalent: str = ""  # why no test can tell it apart, if so


NCCL = ("tests.test_nccl_records", "tests.test_nccl_records_bounds")
RING = ("tests.test_ring_bounds", "tests.test_channel")
FRAME = ("tests.test_frame_bounds", "tests.test_hostile")

MUTATIONS = [
    # The NCCL records (nccl_records.py; TypeScript: link/messages/nccl-records.ts, tensors/nccl-wire.ts).
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if len(data) < _HEAD_BYTES:", "if len(data) <= _HEAD_BYTES:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if nranks < 2 or rank < 1 or rank >= nranks:", "if nranks < 2 or rank < 1 or rank > nranks:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if nranks < 2 or rank < 1 or rank >= nranks:", "if nranks < 2 or rank < 0 or rank >= nranks:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if nranks < 2 or rank < 1 or rank >= nranks:", "if rank < 1 or rank >= nranks:", NCCL,
             equivalent="rank >= 1 and rank < nranks already imply nranks >= 2"),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "    if reserved:\n        raise _malformed(kind, \"reserved bytes are not zero\")\n    has_id",
             "    if False:\n        raise _malformed(kind, \"reserved bytes are not zero\")\n    has_id", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if not has_id and any(data[32:_COMM_REF_BYTES]):", "if False:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if sequence >= 1 << 53:", "if sequence > 1 << 53:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if len(data) < _BUFFER_FIXED:", "if len(data) < _BUFFER_FIXED - 1:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if nbytes < 1 or nbytes >= 1 << 53:", "if nbytes < 0 or nbytes >= 1 << 53:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if nbytes < 1 or nbytes >= 1 << 53:", "if nbytes < 1:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if any(data[_HEAD_BYTES + 26:_BUFFER_FIXED]):", "if any(data[_HEAD_BYTES + 27:_BUFFER_FIXED]):", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if len(data) != _BUFFER_FIXED + 8 * ndim:", "if len(data) < _BUFFER_FIXED + 8 * ndim:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "        if ndim:\n", "        if False:\n", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if ndim > _MAX_NDIM:", "if ndim > _MAX_NDIM + 1:", NCCL),
    Mutation("nccl", "cuda_ipc/link/messages/nccl_records.py", "if size != nbytes:", "if size > nbytes:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "        if not layout.contiguous[i]:", "        if False:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if len(data) < at + _SET_HEADER.size:", "if len(data) < at + _SET_HEADER.size - 1:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if magic != _SET_MAGIC:", "if False:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if version != _SET_VERSION:", "if False:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if reserved or any(data[at + 32:at + _SET_HEADER.size]):", "if reserved:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if count < 1:", "if count < 0:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if packed_length < 1 or packed_length >= 1 << 53:", "if packed_length < 0 or packed_length >= 1 << 53:", NCCL),
    Mutation("nccl", "cuda_ipc/tensors/nccl_wire.py", "if len(data) != at + _SET_HEADER.size + table_length:", "if len(data) < at + _SET_HEADER.size + table_length:", NCCL),
    # The ring's corruption checks (channel/slot_ring.py; TypeScript: channel/slot-ring.ts).
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "        if v < 0:\n            raise corrupt(f\"{what} out of range\")", "        if False:\n            raise corrupt(f\"{what} out of range\")", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "            if t - h > n:\n", "            if t - h > n + 1:\n", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "            if s >= n:\n", "            if s > n:\n", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "        if t - cursor > self.n:", "        if t - cursor > self.n + 1:", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "        if s >= self.n:\n            raise corrupt(f\"ring entry names slot {s} of {self.n}\")\n        so = self.slot_off(s)\n        if w.load64",
             "        if s > self.n:\n            raise corrupt(f\"ring entry names slot {s} of {self.n}\")\n        so = self.slot_off(s)\n        if w.load64", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "        if s >= self.n:\n            raise corrupt(f\"ring entry names slot {s} of {self.n}\")\n        so = self.slot_off(s)\n        if w.load64",
             "        if False:\n            raise corrupt(f\"ring entry names slot {s} of {self.n}\")\n        so = self.slot_off(s)\n        if w.load64", RING),
    Mutation("ring", "cuda_ipc/channel/slot_ring.py", "if w.load64(so + S_POSITION) != cursor or not w.load32(so + S_HOLDERS) & (1 << self.me):",
             "if not w.load32(so + S_HOLDERS) & (1 << self.me):", RING),
    # Frame headers (link/transport/frame.py; TypeScript: link/transport/frame.ts).
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if length < HEADER_BYTES:", "if length < HEADER_BYTES - 1:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if reserved != 0:", "if False:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if payload_length != length - HEADER_BYTES:", "if payload_length > length - HEADER_BYTES:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if declared_fds != fd_count:", "if declared_fds > fd_count:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if encoding > ENC_JSON_WITH_RECORDS:", "if encoding > ENC_JSON_WITH_RECORDS + 1:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "elif ftype == REFUSE and payload_length < 2:", "elif ftype == REFUSE and payload_length < 1:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if count == 0 or count > MAX_RELEASE_IDS or payload_length != RELEASE_HEAD_BYTES + 8 * count:",
             "if count == 0 or count > MAX_RELEASE_IDS + 1 or payload_length != RELEASE_HEAD_BYTES + 8 * count:", FRAME),
    Mutation("frame", "cuda_ipc/link/transport/frame.py", "if count == 0 or count > MAX_RELEASE_IDS or payload_length != RELEASE_HEAD_BYTES + 8 * count:",
             "if count > MAX_RELEASE_IDS or payload_length != RELEASE_HEAD_BYTES + 8 * count:", FRAME),
]


def run_tests(cwd: Path, tests: tuple[str, ...]) -> tuple[bool, float]:
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "unittest", "-q", *tests], cwd=cwd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=300)
        passed = r.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False  # a hang is detected, as Stryker counts a timeout
    return passed, time.monotonic() - t0


def main(argv: list[str]) -> int:
    groups = sorted({m.group for m in MUTATIONS})
    for g in argv:
        if g not in groups:
            print(f"mutate-python: no group {g!r}; the groups are {', '.join(groups)}", file=sys.stderr)
            return 2
    without = {t for t in os.environ.get("CUDA_IPC_MUTATE_WITHOUT", "").split(",") if t}
    chosen = [m for m in MUTATIONS if not argv or m.group in argv]
    chosen = [Mutation(m.group, m.path, m.old, m.new, tuple(t for t in m.tests if t not in without), m.equivalent) for m in chosen]
    try:
        os.nice(10)
    except OSError:
        pass
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cuda-ipc-mutate-") as tmp:
        work = Path(tmp) / "python"
        shutil.copytree(ROOT / "python", work, ignore=shutil.ignore_patterns("__pycache__"))
        # The unmutated tests must pass first, or every mutant would look killed.
        for tests in sorted({m.tests for m in chosen}):
            ok, _ = run_tests(work, tests)
            if not ok:
                print(f"mutate-python: {' '.join(tests)} fails without any mutation; fix that first", file=sys.stderr)
                return 2
        killed: dict[str, int] = {}
        total: dict[str, int] = {}
        bad: list[Mutation] = []
        for i, m in enumerate(chosen, 1):
            path = work / m.path
            original = path.read_text()
            if original.count(m.old) != 1:
                print(f"mutate-python: {m.path}: {m.old!r} occurs {original.count(m.old)} times, not once; update the list", file=sys.stderr)
                return 2
            path.write_text(original.replace(m.old, m.new))
            try:
                passed, seconds = run_tests(work, m.tests)
            finally:
                path.write_text(original)
            total[m.group] = total.get(m.group, 0) + 1
            status = "survived" if passed else "killed"
            if not passed:
                killed[m.group] = killed.get(m.group, 0) + 1
            elif not m.equivalent:
                bad.append(m)
            note = f" (equivalent: {m.equivalent})" if passed and m.equivalent else ""
            first = m.new.strip().splitlines()[0]
            print(f"[{i}/{len(chosen)}] {status:8} {m.path}: {first}  ({seconds:.1f} s){note}", flush=True)
    print(f"\nmutate-python: {time.monotonic() - started:.0f} s in all")
    for g in sorted(total):
        print(f"  {g:6} {killed.get(g, 0)}/{total[g]} killed ({100 * killed.get(g, 0) / total[g]:.0f}%)")
    for m in bad:
        print(f"  SURVIVED, not known to be equivalent: {m.path}: {m.old!r} -> {m.new!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
