"""Rewards: math-verify on the last \\boxed{} with a hard timeout, against real math-verify workers."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rl_core.envs.rewards import RewardResult, VerifierPool, extract_last_boxed, score_answer, score_many


@pytest.fixture(scope="module")
def pool() -> VerifierPool:
    verifier = VerifierPool(num_workers=1)
    verifier.warm_up()
    yield verifier
    verifier.close()


def test_extract_last_boxed_is_brace_matched_and_takes_the_last() -> None:
    assert extract_last_boxed("first \\boxed{1} then \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_last_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert extract_last_boxed("so \\fbox{7}.") == "7"
    assert extract_last_boxed("the answer is \\boxed 5$.") == "5"
    assert extract_last_boxed("no box here") is None
    assert extract_last_boxed("truncated \\boxed{\\frac{1}{") is None


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("so \\boxed{0.5}", "\\frac{1}{2}"),
        ("so \\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ("so \\boxed{\\frac{2}{4}}", "0.5"),
        ("\\boxed{10,\\!080}", "10080"),
        ("\\boxed{x = 3}", "3"),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
        ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("12 + 7 = 19\n\\boxed{19}", "19"),
    ],
)
def test_equivalent_forms_are_accepted(pool: VerifierPool, response: str, reference: str) -> None:
    result = score_answer(response, reference, timeout_s=10.0, pool=pool)
    assert result == RewardResult(reward=1.0, success=True, extracted=result.extracted, timed_out=False)


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"),
        ("\\boxed{0.51}", "\\frac{1}{2}"),
        ("\\boxed{18}", "19"),
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt{2}"),
        ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("first \\boxed{19} then changed my mind \\boxed{20}", "19"),
    ],
)
def test_wrong_answers_are_rejected(pool: VerifierPool, response: str, reference: str) -> None:
    result = score_answer(response, reference, timeout_s=10.0, pool=pool)
    assert result.reward == 0.0 and not result.success and not result.timed_out


@pytest.mark.parametrize("response", ["", "The answer is 19.", "\\boxed{}", "\\boxed{19", "}}}{{{\\boxed"])
def test_no_boxed_answer_scores_zero_without_crashing(pool: VerifierPool, response: str) -> None:
    result = score_answer(response, "19", timeout_s=5.0, pool=pool)
    assert result.reward == 0.0 and not result.success and not result.timed_out


def test_a_check_that_hangs_times_out_scores_zero_and_the_pool_recovers(pool: VerifierPool) -> None:
    # sympy tries to evaluate this power tower and never returns: only the deadline saves the run.
    before = pool.timeouts
    result = score_answer("\\boxed{9^{9^{9^{9}}}}", "1", timeout_s=1.0, pool=pool)
    assert result == RewardResult(reward=0.0, success=False, extracted="9^{9^{9^{9}}}", timed_out=True)
    assert pool.timeouts == before + 1
    # The stuck worker was replaced: the next real check is answered.
    assert score_answer("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", timeout_s=10.0, pool=pool).success


def test_checks_run_from_worker_threads(pool: VerifierPool) -> None:
    # math-verify's own timeouts use signal.alarm (main thread only); ours must work anywhere.
    results: list[RewardResult] = []
    thread = threading.Thread(target=lambda: results.append(score_answer("\\boxed{\\dfrac12}", "0.5", 10.0, pool)))
    thread.start()
    thread.join(60)
    assert results and results[0].success


def test_score_many_keeps_order_and_counts(pool: VerifierPool) -> None:
    pairs = [("\\boxed{3}", "3"), ("nothing", "3"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{4}", "3")]
    results = score_many(pairs, timeout_s=10.0, pool=pool)
    assert [r.success for r in results] == [True, False, True, False]
    assert [r.extracted for r in results] == ["3", None, "\\frac{1}{2}", "4"]


def test_math500_reference_solutions_score_at_least_99_percent(shared_data_dir: Path, pool: VerifierPool) -> None:
    rows = [json.loads(line) for line in (shared_data_dir / "math500" / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 500
    results = score_many([(row["solution"], row["answer"]) for row in rows], timeout_s=5.0, pool=pool)
    assert sum(r.success for r in results) / len(rows) >= 0.99
    # The string-equal fast path decides most of those; make math-verify itself parse the
    # answer forms too (first 120 problems, every subject), so the slow path is exercised on real data.
    verdicts = [pool.check(row["answer"], row["answer"], 5.0)[0] for row in rows[:120]]
    assert sum(verdicts) / len(verdicts) >= 0.99
