"""Taking participants out of the control block (src/channel/recovery.ts): this end leaving, or this
end repairing others in the hub's place once the hub's link closed (slot_ring.py, leave()). A repair needs
the publish lock for microseconds at a time; while a live publisher holds it, the repair is retried
every RETRY seconds, and given up (with a warning) after RECOVERY_GIVE_UP, when the lock belongs to a
process that died inside it and that nobody here can repair.

Also the GPU side of a death (device slots): fence writes a participant queued die with its process,
so once that process is gone the survivors raise its fences from the CPU.
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import IpcError
from . import ring_recovery
from .layout import ST_ALIVE, ST_EMPTY

if TYPE_CHECKING:
    from .block import Block
    from .slot_ring import Ring

RETRY = 0.002
RECOVERY_GIVE_UP = 5.0
FENCE_REPAIR_GIVE_UP = 60.0


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts). Unknown (0) counts as gone."""
    if not pid:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


class Recoveries:
    """The repairs one end (participant ``ring.me``) runs: participants whose leave waits for the
    publish lock (``pending``), and fences of dead processes (``fence_repairs``). ``lock``: the end's."""

    def __init__(self, ring: Ring, block: Block, lock: threading.RLock):
        self.ring = ring
        self.layout = block.layout
        self.fences = block.fences
        self.me = ring.me
        self._lock = lock
        #: Participants whose leave waits for the publish lock: k -> (since, died).
        self.pending: dict[int, tuple[float, bool]] = {}
        #: Dead participants whose fences are raised once their process is gone:
        #: [k, pid, generation, since, next check, pause].
        self.fence_repairs: list[list[Any]] = []
        self._watch_stop = threading.Event()

    def run(self) -> None:
        """Retries the repairs that found the publish lock busy, and raises the fences that are due."""
        if self.pending:
            for k, (since, died) in list(self.pending.items()):
                if time.monotonic() - since > RECOVERY_GIVE_UP:
                    del self.pending[k]
                    warnings.warn(f"cuda_ipc channel: gave up repairing participant {k}: the publish lock stayed held for {RECOVERY_GIVE_UP} s", RuntimeWarning, stacklevel=2)
                    continue
                self.recover(k, died)
        if self.fence_repairs:
            self._repair_fences()

    def sleep_limit(self, timeout: float) -> float:
        """``timeout`` shortened so that a sleep ends when a repair is due."""
        if self.pending:
            timeout = min(timeout, RETRY)  # a repair waits for the publish lock
        if self.fence_repairs:
            timeout = min(timeout, max(0.0, min(r[4] for r in self.fence_repairs) - time.monotonic()))
        return timeout

    def recover(self, k: int, died: bool) -> None:
        try:
            r = ring_recovery.leave(self.ring, k, died, k in self.pending)
        except IpcError as e:
            self.pending.pop(k, None)
            warnings.warn(f"cuda_ipc channel: could not recover participant {k}: {e}", RuntimeWarning, stacklevel=2)
            return
        if r == "busy":
            self.pending.setdefault(k, (time.monotonic(), died))
        else:
            self.pending.pop(k, None)

    def recover_hub(self) -> None:
        """The hub went away: take its place for its own entry and its in-process ends. GPU writes
        they queued die with their process: their fences are raised once it is gone."""
        ring = self.ring
        for k in range(self.layout.max_participants):
            if k == self.me:
                continue
            if k != 0 and not ring.hub_local(k):
                continue
            st = ring.participant_state(k)
            if st == ST_EMPTY:
                continue
            if self.fences is not None:
                # [k, pid, generation, since, next check, pause]: polled 1 ms doubling to 100 ms, as Node does.
                t = time.monotonic()
                self.fence_repairs.append([k, ring.participant_pid(k), ring.participant_generation(k), t, t, 0.001])
            if st == ST_ALIVE:
                self.recover(k, True)

    def _repair_fences(self) -> None:
        fences = self.fences
        assert fences is not None, "fence repairs are queued for device slots only"
        now = time.monotonic()
        keep = []
        for r in self.fence_repairs:
            k, pid, generation, since, due, pause = r
            if now < due:
                keep.append(r)
                continue
            if self.ring.participant_generation(k) != generation:
                continue  # the entry was handed out again
            if process_gone(pid):
                ring_recovery.raise_fences_of(self.ring, k, fences)
            elif now - since < FENCE_REPAIR_GIVE_UP:
                r[4], r[5] = now + pause, min(pause * 2, 0.1)
                keep.append(r)
        self.fence_repairs[:] = keep

    def watch_hub(self) -> None:
        """GPU work queued here may wait for fences only we can raise once the hub died, while this
        end's thread is blocked in that very work (a torch sync): a watcher thread raises them."""
        threading.Thread(target=self._watch_hub, name="cuda_ipc-channel-fence-watch", daemon=True).start()

    def _watch_hub(self) -> None:
        """Once the hub's process is gone, raises the fences of the hub and its in-process ends."""
        fences = self.fences
        assert fences is not None, "the watcher runs for device slots only"
        pid = self.ring.participant_pid(0)
        while not self._watch_stop.wait(0.1):
            if not process_gone(pid):
                continue
            with self._lock:
                if self._watch_stop.is_set():
                    return  # the end closed
                for k in range(self.layout.max_participants):
                    if k == self.me or self.ring.participant_state(k) == ST_EMPTY:
                        continue
                    if k == 0 or self.ring.hub_local(k):
                        ring_recovery.raise_fences_of(self.ring, k, fences)
            return

    def stop(self) -> None:
        """The end closes: the watcher thread ends."""
        self._watch_stop.set()

    def leave_self(self) -> None:
        """Leaves cleanly; the lock is held for microseconds at a time, so this retries for a while."""
        deadline = time.monotonic() + RECOVERY_GIVE_UP
        resuming = False
        while True:
            r = ring_recovery.leave(self.ring, self.me, False, resuming)
            if r != "busy":
                return
            resuming = True
            if time.monotonic() > deadline:
                raise IpcError("ERR_TIMEOUT", f"leaving the channel: the publish lock stayed held for {RECOVERY_GIVE_UP} s (a process died inside it and was not repaired)")
            time.sleep(RETRY)
