"""The tile counters of kernels that draw their tiles at run time: sdpa_prefill_sm90's ragged and paged variants
(Runtime.prefill's ragged calls and Runtime.attention's paged kernel: RaggedTiles) and its dense causal D128 and
D256 ones (their tail: PersistentTiles.drawn_plan); launch fact draws_tiles, aotc.kernels.tile_scheduler.

Such a kernel draws from an int32 that is 0 when it starts, and leaves it 0. Launches on one stream run one
after another and can share one counter; launches on two streams may run at once and must not (their draws
would mix: tiles skipped or run twice). So each (device, stream) gets a counter of its own: a 4-byte slot of a
zeroed buffer, handed out on the stream's first launch and kept, with its buffer, as long as the Runtime.

A plan that draws tiles reserves the device's first buffer when it is made, so a first launch on a new stream,
a CUDA graph capture's included, only takes a slot (no allocation, which a capture forbids). A CUDA graph keeps
the counter of the stream it was captured on: it must not replay while a launch on that stream runs (another
graph captured there included), as two streams sharing a counter would. torch.cuda.graph() captures on one
side stream per process unless given a stream, so graphs captured that way share a counter: give each its own
capture stream if two may replay at once. Two launches that ever share a counter leave it non-zero, and every
later launch on that stream then skips or repeats tiles: the rule is not optional.
"""
from __future__ import annotations

import threading

from ..common.errors import ArgumentError
from .workspace import zeroed_buffer

SLOTS_PER_BUFFER = 1024  # int32 counters per buffer (4 KB): more distinct streams than this take another buffer


class TileCounters:
    """Per device, the buffers of counters and the slot each stream was given."""

    def __init__(self, allocate=None, slots_per_buffer: int = SLOTS_PER_BUFFER):
        self._allocate = allocate  # nbytes -> buffer with .ptr; driver.DeviceBuffer (zeroed) unless a test gives another
        self._per_buffer = slots_per_buffer
        self._slots: dict[tuple[int, int], int] = {}  # (device, stream) -> the counter's address
        self._buffers: dict[int, list] = {}           # device -> its buffers, the last one being handed out
        self._used: dict[int, int] = {}               # device -> slots handed out of its last buffer
        self._lock = threading.Lock()

    def reserve(self, device: int) -> None:
        """Make sure the device has a buffer with a free slot (called while a plan is made)."""
        with self._lock:
            if self._full(device):
                self._new_buffer(device)

    def get(self, device: int, stream: int) -> int:
        """The address of the stream's counter on the device."""
        ptr = self._slots.get((device, stream))
        if ptr is not None:
            return ptr
        with self._lock:
            ptr = self._slots.get((device, stream))
            if ptr is None:
                if self._full(device):
                    try:
                        self._new_buffer(device)
                    except Exception as e:  # e.g. inside a CUDA graph capture, which forbids allocating
                        raise ArgumentError("stream", hex(stream), f"a stream whose tile counter can be allocated "
                                            f"now ({len(self._slots)} streams hold one; {e})") from e
                ptr = self._buffers[device][-1].ptr + 4 * self._used[device]
                self._used[device] += 1
                self._slots[(device, stream)] = ptr
            return ptr

    def _full(self, device: int) -> bool:
        """No slot left to hand out on the device (no buffer yet, or the last one all given)."""
        return device not in self._buffers or self._used[device] == self._per_buffer

    def _new_buffer(self, device: int) -> None:
        self._buffers.setdefault(device, []).append(zeroed_buffer(4 * self._per_buffer, self._allocate))
        self._used[device] = 0

    @property
    def nbytes(self) -> int:
        """Device memory the counters hold."""
        return sum(b.nbytes for bufs in self._buffers.values() for b in bufs)
