"""A plan's launch without a GPU: Plan.bind replaced by a recorder that lays out the real parameter buffer
(aotc.runtime.launch.ParamBuffer) and appends its slot values at every launch."""
from __future__ import annotations

from types import SimpleNamespace

from aotc.runtime.launch import ParamBuffer
from aotc.runtime.plan import Plan


def record_launches(monkeypatch) -> list[dict]:
    """Every later launch of any plan appends {parameter: value} (descriptors: None), its "grid" and its "stream" to
    the returned list."""
    launched: list[dict] = []

    def bind(self, kernel, grid, device, values):
        self.kernel, self.device = kernel, device
        params = ParamBuffer(kernel.artifact.abi)
        # as PreparedLaunch: every parameter of the kernel has a value, values of others are not written
        missing = set(params.slots) - set(values)
        if missing:
            raise ValueError(f"no value for parameters {sorted(missing)}")
        params.update({name: values[name] for name in params.slots})
        shape = {"grid": tuple(grid)}  # driver.Launcher.set_grid_x rewrites x for later launches

        def set_grid_x(x):
            shape["grid"] = (x, *shape["grid"][1:])

        def launch_on(stream, grid=None):
            launched.append({**{n: getattr(s, "value", None) for n, s in params.slots.items()},
                             "grid": grid or shape["grid"], "stream": stream})

        def with_grid_x(x):  # PreparedLaunch.with_grid_x: the same parameters on (x, y, z)
            return lambda stream: launch_on(stream, (x, *shape["grid"][1:]))

        self.launcher = SimpleNamespace(params=params, empty=not all(grid), grid=tuple(grid), with_grid_x=with_grid_x,
                                        launch=SimpleNamespace(set_grid_x=set_grid_x))
        self._launch = launch_on
        self._params = {p.name: p for p in kernel.artifact.abi.params}

    monkeypatch.setattr(Plan, "bind", bind)
    return launched


class RecordingSlot:
    """A DescriptorSlot (aotc.runtime.tma) that keeps its recipe instead of encoding."""

    def __init__(self, recipe, address):
        self.recipe, self.address, self.data = recipe, address, bytes(128)

    def update(self, address):
        if address == self.address:
            return None
        self.address = address
        return self.data


COUNTERS = 1 << 40


def stream_counters():
    """A fake runtime's tile_counters (aotc.runtime.counters): each stream's counter at COUNTERS + stream, an
    address that names the stream in a recorded launch's tile_counter."""
    return SimpleNamespace(reserve=lambda device: None, get=lambda device, stream: COUNTERS + stream)


SPLITS = 1 << 41


def split_arena():
    """A fake runtime's split_workspaces (aotc.runtime.workspace.WorkspaceArena): each stream's buffer at
    SPLITS + stream * 2^24, exactly as large as a plan asks (its partials at the front, its counters at the back)."""
    return SimpleNamespace(reserve=lambda device, partials, counters: None,
                           get=lambda device, stream, partials, counters: SimpleNamespace(
                               ptr=SPLITS + (stream << 24), nbytes=partials + counters))


class OneTile:
    """A stand-in runtime's kv tile choice (Runtime.matching, Runtime.fact_bounds): no loaded kernel to order by a
    launch fact, so dispatch asks its find() for the wanted fields as they are."""

    def matching(self, family, device, want):
        return []

    def fact_bounds(self, family, name, device):
        return ()
