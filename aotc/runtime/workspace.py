"""The split-decode workspace a Runtime's plans share: one arena per device.

A decode step whose sequences split over several CTAs writes fp32 partials and int32 counters into a
workspace (aotc.runtime.decode.workspace_layout: partials from the front, counters ending at the back, so
one buffer of at least the largest partials plus the largest counters serves every plan). A plan that
owned its buffer freed it with itself; but the one-call APIs' plan cache evicts its oldest plans
(Runtime.MAX_PLANS), and a CUDA graph captured with an evicted plan's launch then wrote into freed memory;
and a serving engine's plans (one a layer and batch size) held megabytes each. The arena belongs to the
Runtime: a plan takes the current buffer when it fits, else the arena allocates a larger one (zeroed, at
least 1.5x the last) for it and later plans; no buffer is freed while the Runtime or a plan holding it
lives, so neither an eviction nor a captured graph ever sees freed memory.

Every launch leaves the counters zero, and a buffer is zeroed once, when allocated: a plan made while
another plan's step runs writes nothing into the buffer. Plans of one buffer must not run at the same
time on two streams (their partials and counters would mix): give a plan that does a workspace of its
own (prepare_decode / prepare_attention(workspace=)), or use a second Runtime (its own arena). Plans are
not made per stream: a CUDA graph is captured on a stream of its own, after a warm-up call made the plan.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

GROWTH = 1.5


def zeroed_buffer(nbytes: int, allocate=None):
    """Zeroed device memory of the runtime's own (driver.DeviceBuffer), or what a test's `allocate` gives."""
    if allocate is not None:
        return allocate(nbytes)
    from .driver import DeviceBuffer

    return DeviceBuffer(nbytes)


@dataclass
class _Buffer:
    memory: object       # driver.DeviceBuffer (or a test's stand-in with .ptr and .nbytes)
    partials: int        # the largest partials (bytes from the front) of a plan given this buffer
    counters: int        # the largest counters (bytes ending at the back)


class WorkspaceArena:
    """Per device, the buffer plans get (take()) and every buffer ever given out (kept alive)."""

    def __init__(self, allocate=None):
        self._allocate = allocate  # nbytes -> buffer; driver.DeviceBuffer unless a test gives another
        self._current: dict[int, _Buffer] = {}
        self._all: list = []
        self._lock = threading.Lock()

    def take(self, device: int, partials: int, counters: int):
        """A zeroed buffer with room for `partials` bytes at its front and `counters` at its back, beside
        those of every plan given it before (the same buffer when it fits, else a new, larger one)."""
        with self._lock:
            cur = self._current.get(device)
            if cur is not None:
                need = max(cur.partials, partials) + max(cur.counters, counters)
                if need <= cur.memory.nbytes:
                    cur.partials, cur.counters = max(cur.partials, partials), max(cur.counters, counters)
                    return cur.memory
                partials, counters = max(cur.partials, partials), max(cur.counters, counters)
            nbytes = partials + counters
            if cur is not None:
                nbytes = max(nbytes, int(cur.memory.nbytes * GROWTH))
            memory = zeroed_buffer((nbytes + 15) // 16 * 16, self._allocate)
            self._current[device] = _Buffer(memory, partials, counters)
            self._all.append(memory)
            return memory

    @property
    def nbytes(self) -> int:
        """Device memory the arena holds, every buffer it has given out."""
        return sum(m.nbytes for m in self._all)
