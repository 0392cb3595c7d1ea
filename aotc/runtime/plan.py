"""What every prepared plan shares: one kernel, its parameter buffer bound by name from the kernel's ABI,
per-call pointer checks from the ABI's pointee alignments, the LSE-or-not rule, and the plan cache of the
one-call APIs.

A family's plan supplies only its validation (a named record), kernel selection, parameter values and
grid, then calls Plan.bind(); its run() writes the new pointers into the slots Plan.slots() returns,
after Plan.misaligned() and Plan.check_lse() (a few integer operations per call).
"""
from __future__ import annotations

from ..common.errors import ArgumentError


class Plan:
    """Base of CombinePlan, PrefillPlan and DecodePlan (see their modules)."""

    family = ""
    has_lse = False

    def bind(self, kernel, grid: tuple[int, int, int], device: int, values: dict) -> None:
        """Prepare the launch: every ABI parameter of `kernel` must have a value."""
        self.kernel = kernel
        self.variant = kernel.variant
        self.device = device
        from .launch import PreparedLaunch  # libcuda loads with the first plan, not with load()

        self.launcher = PreparedLaunch(kernel, grid, device, values)
        self._launch = self.launcher.launch  # run()'s last step: cuLaunchKernelEx with prebuilt arguments
        self._params = {p.name: p for p in kernel.artifact.abi.params}

    def slots(self, *names: str) -> tuple:
        """The parameter-buffer slots of these parameters (assign .value, or .raw for a descriptor)."""
        return tuple(self.launcher.params.slots[n] for n in names)

    def alignment(self, name: str) -> int:
        """The pointee alignment the kernel assumes for pointer `name` (1 in an ABI that records none)."""
        return max(1, self._params[name].pointee_align)

    def masks(self, *names: str) -> tuple[int, ...]:
        """alignment - 1 of each pointer: `ptr & mask` is non-zero for a misaligned pointer."""
        return tuple(self.alignment(n) - 1 for n in names)

    def misaligned(self, names: tuple[str, ...], pointers: tuple[int, ...]) -> ArgumentError:
        """The error for pointers one of which breaks its alignment (the caller found one that does)."""
        shown = {n: hex(p) for n, p in zip(names, pointers)}
        return ArgumentError("pointers", shown, "aligned as the kernel assumes: " +
                             ", ".join(f"{n} {self.alignment(n)} bytes" for n in names))

    def check_lse(self, lse: int) -> None:
        if self.has_lse == (lse == 0):
            raise ArgumentError("lse", hex(lse), "a pointer" if self.has_lse else "0 (the plan writes no LSE)")

    @property
    def empty(self) -> bool:
        """Nothing to compute (an extent is 0): calls return without launching."""
        return self.launcher.empty


def cached_plan(runtime, key, make):
    """The runtime's plan for `key` (a tuple of the layout facts a plan fixes), made by make() once."""
    plan = runtime.plans.get(key)
    if plan is None:
        plan = make()
        runtime.remember_plan(key, plan)
    return plan


def torch_key(family: str, device: int, layouts: tuple, fixed: tuple, scalars: tuple) -> tuple:
    """The plan-cache key of a one-call API given torch tensors: their torch_layouts (which fix every check
    a plan makes but those on pointers), the pointers of the tensors the plan holds (caches, workspace),
    and the call's other arguments. A plan found under it needs only the per-call pointers."""
    return (family, "torch", device, layouts, tuple(None if t is None else t.data_ptr() for t in fixed), scalars)
