"""A plan's launch without a GPU: Plan.bind replaced by a recorder that lays out the real parameter buffer
(aotc.runtime.launch.ParamBuffer) and appends its slot values at every launch."""
from __future__ import annotations

from types import SimpleNamespace

from aotc.runtime.launch import ParamBuffer
from aotc.runtime.plan import Plan


def record_launches(monkeypatch) -> list[dict]:
    """Every later launch of any plan appends {parameter: value} (descriptors: None) to the returned list."""
    launched: list[dict] = []

    def bind(self, kernel, grid, device, values):
        self.kernel, self.device = kernel, device
        params = ParamBuffer(kernel.artifact.abi)
        params.update(values)
        self.launcher = SimpleNamespace(params=params, empty=not all(grid))
        self._launch = lambda stream: launched.append({n: getattr(s, "value", None) for n, s in params.slots.items()})
        self._params = {p.name: p for p in kernel.artifact.abi.params}

    monkeypatch.setattr(Plan, "bind", bind)
    return launched
