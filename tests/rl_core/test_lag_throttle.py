"""The async max_lag bound as bookkeeping: slot deadlines fixed at submission, finished groups
held back only while an older group still needs the room."""

from __future__ import annotations

from rl_core.actor.lag_throttle import LagThrottle


def throttle() -> LagThrottle[str, int]:
    # max_lag 1, 4 samples per step, groups of 2: a group's samples must land within
    # (1 + 1) * 4 = 8 stream slots of the trainer's consumed count at its submission.
    return LagThrottle(max_lag=1, samples_per_step=4, group_size=2)


def test_submission_counts_unconsumed_and_pending_samples() -> None:
    lag = throttle()
    assert lag.may_submit(written=6, consumed=0)  # 6 + 0 + 2 <= 8
    assert not lag.may_submit(written=7, consumed=0)
    lag.on_submitted("a", consumed=0)
    assert not lag.may_submit(written=6, consumed=0)  # 6 + 2 + 2 > 8
    assert lag.may_submit(written=6, consumed=4)  # the trainer took a step


def test_a_group_finishing_after_later_ones_keeps_its_slot() -> None:
    lag = throttle()
    for key in "xya":
        lag.on_submitted(key, consumed=0)  # deadline: slot 8
    lag.on_finished("x", [1, 2])
    lag.on_finished("y", [3, 4])
    assert lag.take_writable(written=0) == [[1, 2], [3, 4]]
    # The trainer takes those 4 (one step) while "a" is still generating.
    for key in "bcd":
        assert lag.may_submit(written=4, consumed=4)
        lag.on_submitted(key, consumed=4)  # deadline: slot 12
    assert not lag.may_submit(written=4, consumed=4)
    for key, samples in (("b", [5, 6]), ("c", [7, 8]), ("d", [9, 10])):
        lag.on_finished(key, samples)
    # "a" needs slots 6-7 to be trained at lag <= 1: b may go in front of it, c and d wait.
    assert lag.take_writable(written=4) == [[5, 6]]
    assert lag.take_writable(written=6) == []
    lag.on_finished("a", [11, 12])
    assert lag.take_writable(written=6) == [[11, 12], [7, 8], [9, 10]]
    assert lag.pending == {}


def test_an_empty_or_abandoned_group_frees_its_room() -> None:
    lag = throttle()
    for key in "abcd":
        lag.on_submitted(key, consumed=0)
    lag.on_finished("a", [])  # a dropped zero-advantage group writes nothing
    lag.on_abandoned("b")
    lag.on_finished("c", [1, 2])
    lag.on_finished("d", [3, 4])
    assert lag.take_writable(written=4) == [[1, 2], [3, 4]]


def test_past_deadline_groups_are_still_written_in_deadline_order() -> None:
    lag = throttle()
    lag.on_submitted("a", consumed=0)
    lag.on_submitted("b", consumed=4)
    lag.on_finished("b", [3])
    lag.on_finished("a", [1, 2])
    # The stream is already past a's deadline (a resumed run): nothing is held forever.
    assert lag.take_writable(written=20) == [[1, 2], [3]]
