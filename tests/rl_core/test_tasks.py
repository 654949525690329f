"""Tasks: the seeded synthetic arithmetic task and math JSONL datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_core.config.run_config import TaskConfig
from rl_core.envs.problems import Problem, TaskDataError, build_messages, load_jsonl_problems, load_task, make_arithmetic_problem


def test_synthetic_task_is_seeded_and_heldout_is_disjoint() -> None:
    config = TaskConfig(seed=3, heldout_size=50, train_size=300)
    first, second = load_task(config), load_task(config)
    assert [p.id for p in first.train] == [p.id for p in second.train]
    assert [p.id for p in first.heldout] == [p.id for p in second.heldout]
    assert len(first.heldout) == 50 and len(first.train) == 300
    assert not {p.id for p in first.train} & {p.id for p in first.heldout}
    assert len({p.id for p in first.train}) == 300  # distinct prompts
    other_seed = load_task(config.model_copy(update={"seed": 4}))
    assert [p.id for p in other_seed.heldout] != [p.id for p in first.heldout]


def test_arithmetic_answers_and_solutions_are_right() -> None:
    config = TaskConfig(num_terms=4, operators=["+", "-", "*"], max_operand=9, heldout_size=20, train_size=200)
    for problem in load_task(config).train:
        expression = problem.problem.removeprefix("Compute ").removesuffix(".")
        assert int(problem.answer) == eval(expression)  # Python's precedence is the reference
        assert problem.solution is not None and problem.solution.endswith(f"\\boxed{{{problem.answer}}}")
    problem = make_arithmetic_problem([2, 3, 4], ["+", "*"])
    assert problem.answer == "14" and problem.solution == "3 * 4 = 12\n02 + 12: 2+2=4, 0+1=1, so 14\n\\boxed{14}"
    assert make_arithmetic_problem([6, 18], ["-"]).solution == "-(18 - 06): 8-6=2, 1-0=1, so -12\n\\boxed{-12}"
    assert make_arithmetic_problem([13, 8], ["-"]).solution == "13 - 08: 13-8=5, 1-0-1=0, so 5\n\\boxed{5}"


def test_epochs_repeat_the_same_prompts_in_a_new_order() -> None:
    task = load_task(TaskConfig(train_size=100))
    epoch0, epoch1 = task.epoch(0), task.epoch(1)
    assert sorted(p.id for p in epoch0) == sorted(p.id for p in epoch1)
    assert [p.id for p in epoch0] != [p.id for p in epoch1]
    assert task.epoch(1) == epoch1  # reproducible
    stream = task.train_stream()
    pairs = [next(stream) for _ in range(201)]
    assert pairs[99][0] == 0 and pairs[100][0] == 1 and pairs[200][0] == 2
    assert [p for _, p in pairs[100:200]] == epoch1


def test_too_small_problem_space_is_a_clear_error() -> None:
    config = TaskConfig(min_operand=0, max_operand=1, num_terms=2, operators=["+"], heldout_size=10)
    with pytest.raises(TaskDataError, match="heldout_size"):
        load_task(config)


def test_build_messages_is_chat_form() -> None:
    problem = Problem(id="p", problem="Compute 1 + 1.", answer="2")
    assert build_messages(problem, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Compute 1 + 1."},
    ]
    assert build_messages("What?", None) == [{"role": "user", "content": "What?"}]


def _write(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_jsonl_rows_load_and_bad_rows_are_named(tmp_path: Path) -> None:
    good = {"id": "a", "problem": "1+1?", "answer": "2", "solution": "\\boxed{2}", "source": "t", "meta": {"level": 1}}
    problems = load_jsonl_problems(_write(tmp_path / "ok.jsonl", [good, {**good, "id": "b"}]))
    assert [p.id for p in problems] == ["a", "b"] and problems[0].meta == {"level": 1}
    no_answer = _write(tmp_path / "no_answer.jsonl", [good, {"id": "c", "problem": "x?"}])
    with pytest.raises(TaskDataError, match=r"no_answer\.jsonl:2: row has no 'answer'"):
        load_jsonl_problems(no_answer)
    no_problem = _write(tmp_path / "no_problem.jsonl", [{"id": "c", "answer": "1"}])
    with pytest.raises(TaskDataError, match=r"no_problem\.jsonl:1: row has no 'problem'"):
        load_jsonl_problems(no_problem)
    broken = _write(tmp_path / "broken.jsonl", [good, "{not json"])
    with pytest.raises(TaskDataError, match=r"broken\.jsonl:2: not valid JSON"):
        load_jsonl_problems(broken)
    with pytest.raises(TaskDataError, match="not found"):
        load_jsonl_problems(tmp_path / "missing.jsonl")


def test_math_jsonl_task_holds_out_a_disjoint_slice(shared_data_dir: Path) -> None:
    config = TaskConfig(kind="math_jsonl", train_path=str(shared_data_dir / "gsm8k" / "train.jsonl"), heldout_size=32)
    task = load_task(config)
    assert len(task.heldout) == 32 and len(task.train) == 7473 - 32
    assert not {p.id for p in task.train} & {p.id for p in task.heldout}
    with_eval = load_task(config.model_copy(update={"eval_path": str(shared_data_dir / "math500" / "test.jsonl")}))
    assert len(with_eval.train) == 7473 and with_eval.heldout[0].source == "MATH-500"
