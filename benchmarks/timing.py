"""GPU timing shared by the benchmarks: settle the clocks first, then time; contenders interleaved.

Why the settling. The H200 runs these kernels at its power limit (~690 W), and its SM clock
follows the power drawn by whatever ran just before. A contender timed right after a hotter one
starts at a lower clock and needs some milliseconds to climb back. A measured case:
the portable family, always timed right after the Hopper family, ran 5-13% below a byte-identical
cubin timed a contender later (D256 S2048, benchmarks/results/prefill_experiment_bench_order.json),
with spreads of 10-22% across rounds where the others had 1-2%. So every contender first runs
alone for SETTLE_MS of GPU time, and the order of the contenders rotates from round to round so
that no one always follows the same neighbour.
"""
from __future__ import annotations

import statistics
from typing import Callable

SETTLE_MS = 100.0  # GPU time each contender runs untimed before its trials


def settle(run_once: Callable[[], None], ms: float = SETTLE_MS) -> None:
    """Run run_once (one enqueue) until about `ms` of GPU time has passed, at least 3 times."""
    import torch

    for _ in range(3):
        run_once()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    run_once()
    e1.record()
    e1.synchronize()
    once = max(e0.elapsed_time(e1), 1e-3)
    for _ in range(min(int(ms / once), 100_000)):
        run_once()
    torch.cuda.synchronize()


def event_time(fn, flush, reps=10, trials=5):
    """(median ms per call, spread) of `reps` back-to-back calls of fn, `trials` times, each trial after
    an L2 flush, once the clocks have settled on fn; spread = (max - min) / median over trials."""
    import torch

    settle(fn)
    times = []
    for _ in range(trials):
        flush()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    return statistics.median(times), (max(times) - min(times)) / statistics.median(times)


def graph_time(fn, flush, calls=10, replays=20):
    """Median µs per call of a CUDA graph of `calls` launches of fn, over `replays` replays, each after
    an L2 flush, once the clocks have settled on the graph."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    settle(g.replay)
    times = []
    for _ in range(replays):
        flush()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(times)


def interleaved(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Time each contender once per round (each callable returns one measurement), the order rotated
    by one every round: {name: [measurement per round]}."""
    names = list(contenders)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for n in names[k:] + names[:k]:
            samples[n].append(contenders[n]())
    return samples


def medians(samples: dict[str, list[float]], unit: str) -> tuple[dict[str, float], dict[str, float]]:
    """interleaved()'s samples as (median by name, row fields {name}_{unit} and {name}_spread = (max - min) /
    median)."""
    med = {n: statistics.median(ts) for n, ts in samples.items()}
    fields = {f"{n}_{unit}": v for n, v in med.items()}
    fields.update({f"{n}_spread": (max(ts) - min(ts)) / med[n] for n, ts in samples.items()})
    return med, fields

