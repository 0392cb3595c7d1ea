"""The benchmarks' interleaving (benchmarks/timing.py) needs no GPU: rotation and sample bookkeeping."""
from benchmarks.timing import interleaved


def test_interleaved_rotates_the_order_every_round():
    calls = []

    def contender(name, value):
        def measure():
            calls.append(name)
            return value
        return measure

    samples = interleaved({"a": contender("a", 1.0), "b": contender("b", 2.0), "c": contender("c", 3.0)}, rounds=4)
    assert samples == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}
    # round r starts at contender r mod 3, so no contender always follows the same one
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]


def test_interleaved_with_no_contenders_or_rounds():
    assert interleaved({}, rounds=3) == {}
    assert interleaved({"a": lambda: 1.0}, rounds=0) == {"a": []}
