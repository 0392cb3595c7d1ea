"""The split workspaces a Runtime's plans share: one buffer per (device, stream).

A decode step whose sequences split over several CTAs writes fp32 partials and int32 counters into a
workspace (aotc.runtime.decode.workspace_layout: partials from the front, counters ending at the back, so
one buffer of at least the largest partials plus the largest counters serves every plan); the paged prefill
kernel's KV splits and the dense non-causal Hopper prefill's split tail do the same
(aotc.families.sdpa_prefill_sm90.split_workspace_bytes: 8.9 MB at D128 and 17.6 MB at D256 on 132 SMs). A plan that owned its
buffer freed it with itself; but the one-call APIs' plan cache evicts its oldest plans (Runtime.MAX_PLANS),
and a CUDA graph captured with an evicted plan's launch then wrote into freed memory; and a serving engine's
plans (one a layer and batch size) held megabytes each. The arena belongs to the Runtime and no buffer it
ever gave out is freed while the Runtime lives, so neither an eviction nor a captured graph sees freed memory.

Launches on one stream run one after another and may share a buffer; launches on two streams may run at
once (two micro-batches overlapped on two streams, a graph replayed beside eager steps) and must not: their
partials and counters would mix and rows come out wrong, silently. So each stream gets a buffer of its own
at its first launch (get()), as each gets a tile counter (aotc.runtime.counters), and keeps it while it fits
the plans launching there. A plan reserves its needs when it is made (reserve()): the device then holds a
spare buffer, zeroed, as large as the largest plan's partials plus counters, which a stream's first launch
takes without allocating, as a CUDA graph capture requires (a capture forbids allocating); a stream that is
not capturing replaces the spare at once, so the next new stream, a capture's included, finds one. A stream
whose buffer a later, larger plan outgrows takes the spare in its place; the old buffer stays the stream's
plans' (it is never given to another stream). A CUDA graph keeps the buffer of the stream it was captured on,
as it keeps that stream's tile counter: it must not replay while a launch on that stream runs.

Every launch leaves the counters zero, and a buffer is zeroed once, when allocated.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..common.errors import ArgumentError

GROWTH = 1.5


def zeroed_buffer(nbytes: int, allocate=None):
    """Zeroed device memory of the runtime's own (driver.DeviceBuffer), or what a test's `allocate` gives."""
    if allocate is not None:
        return allocate(nbytes)
    from .driver import DeviceBuffer

    return DeviceBuffer(nbytes)


def _capturing(stream: int) -> bool:
    from .driver import stream_capturing

    return stream_capturing(stream)


@dataclass
class _Buffer:
    memory: object       # driver.DeviceBuffer (or a test's stand-in with .ptr and .nbytes)
    partials: int        # the largest partials (bytes from the front) of a plan given this buffer
    counters: int        # the largest counters (bytes ending at the back)

    def fits(self, partials: int, counters: int) -> bool:
        return max(self.partials, partials) + max(self.counters, counters) <= self.memory.nbytes


class WorkspaceArena:
    """Per device, each stream's buffer, a spare for the next stream, and every buffer ever given out (kept alive)."""

    def __init__(self, allocate=None, capturing=None):
        self._allocate = allocate  # nbytes -> buffer; driver.DeviceBuffer unless a test gives another
        self._capturing = capturing or _capturing  # stream -> whether it is capturing a CUDA graph
        self._streams: dict[tuple[int, int], _Buffer] = {}  # (device, stream) -> its buffer
        self._spare: dict[int, _Buffer] = {}                # device -> the buffer the next stream takes
        self._needs: dict[int, tuple[int, int]] = {}        # device -> (largest partials, largest counters)
        self._all: list = []
        self._lock = threading.Lock()

    def reserve(self, device: int, partials: int, counters: int) -> None:
        """A plan needing `partials` bytes at a buffer's front and `counters` at its back is made: the device's
        spare grows to fit it beside every other plan (called while a plan is prepared, outside any capture)."""
        with self._lock:
            spare = self._spare.get(device)
            if spare is None or not spare.fits(partials, counters):
                self._new_spare(device, partials, counters)
            else:
                self._note_needs(device, partials, counters)

    def get(self, device: int, stream: int, partials: int, counters: int):
        """The buffer a plan launching on `stream` writes (reserve()d first): the stream's own when it has room for
        these partials and counters beside those of every plan given it before, else the device's spare."""
        with self._lock:
            key = (device, stream)
            cur = self._streams.get(key)
            if cur is not None and cur.fits(partials, counters):
                cur.partials, cur.counters = max(cur.partials, partials), max(cur.counters, counters)
                return cur.memory
            capturing = self._capturing(stream)
            spare = self._spare.get(device)
            if spare is None or not spare.fits(partials, counters):
                if capturing:
                    raise ArgumentError("stream", hex(stream), "a stream with a split workspace of its own or a spare "
                                        "one to take (a capture cannot allocate): make the plan (a warm-up call) "
                                        "before capturing, and capture no two new streams without an eager call "
                                        "between them")
                self._new_spare(device, partials, counters)
                spare = self._spare[device]
            del self._spare[device]
            spare.partials, spare.counters = partials, counters
            self._streams[key] = spare
            if not capturing:  # the next new stream (a capture's) takes one without allocating
                self._new_spare(device)
            return spare.memory

    def _note_needs(self, device: int, partials: int, counters: int) -> tuple[int, int]:
        p, c = self._needs.get(device, (0, 0))
        needs = self._needs[device] = max(p, partials), max(c, counters)
        return needs

    def _new_spare(self, device: int, partials: int = 0, counters: int = 0) -> None:
        """A zeroed spare fitting the device's largest plans (these needs included); one replacing a spare that
        no longer fits grows by GROWTH at least, and the old one, never given out, is dropped."""
        nbytes = sum(self._note_needs(device, partials, counters))
        old = self._spare.pop(device, None)
        if old is not None:
            nbytes = max(nbytes, int(old.memory.nbytes * GROWTH))
            self._all = [m for m in self._all if m is not old.memory]
        memory = zeroed_buffer((max(nbytes, 16) + 15) // 16 * 16, self._allocate)
        self._all.append(memory)
        self._spare[device] = _Buffer(memory, 0, 0)

    @property
    def nbytes(self) -> int:
        """Device memory the arena holds, every buffer it has given out and its spares."""
        return sum(m.nbytes for m in self._all)


class StreamBuffers:
    """A plan's share of an arena: its needs reserved when it is made, and per stream the values its kernel's
    workspace parameters take there (values_of(buffer), computed at the plan's first launch on the stream)."""

    __slots__ = ("_arena", "_device", "_needs", "_values_of", "_by_stream", "_written")

    def __init__(self, arena: WorkspaceArena, device: int, partials: int, counters: int, values_of):
        arena.reserve(device, partials, counters)
        self._arena, self._device, self._needs, self._values_of = arena, device, (partials, counters), values_of
        self._by_stream: dict[int, tuple] = {}
        self._written = None  # the values the slots hold (write())

    def write(self, stream: int, slots) -> None:
        """The kernel's workspace parameter slots set for a launch on `stream` (written where the stream's values
        differ from the last launch's: a lookup otherwise)."""
        v = self._by_stream.get(stream) or self.values(stream)
        if v is not self._written:
            self._written = v
            for slot, value in zip(slots, v):
                slot.value = value

    def values(self, stream: int) -> tuple:
        """The workspace parameters' values for a launch on `stream` (the same tuple at every launch there)."""
        v = self._by_stream.get(stream)
        if v is None:
            v = self._by_stream[stream] = tuple(self._values_of(self._arena.get(self._device, stream, *self._needs)))
        return v
