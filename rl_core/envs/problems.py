"""Training tasks: what the actor asks the policy, and the reference answers.

Two kinds, chosen by `TaskConfig.kind`:

- `synthetic`: seeded arithmetic problems ("Compute 12 + 7 - 3.") with a step
  by step reference solution ending in `\\boxed{answer}`. The held-out set is
  drawn first and the training set never contains one of its expressions, so
  `success/heldout` measures generalisation, not memorisation.
- `math_jsonl`: rows of a math dataset in the schema of `shared/data/README.md`
  (id/problem/answer/solution/source/meta), or a hub dataset id where a hub is
  reachable and the `datasets` package is installed.

The train side is a fixed list of prompts re-used every epoch in a fresh
seeded order: HistoSpec drafts from the previous epoch's responses to the same
prompt, so the same `Problem.id` must come back.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rl_core.config.run_config import TaskConfig

# The prompt the eval harness and the demo use for math benchmarks.
MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Problem:
    id: str  # stable across epochs and runs: the HistoSpec/HistoPipe history key
    problem: str  # the statement shown to the model
    answer: str  # reference final answer, compared with math-verify
    source: str = ""  # human-readable set name, e.g. "synthetic", "MATH-500"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    solution: str | None = field(default=None, compare=False)  # worked solution where known


class TaskDataError(ValueError):
    """A dataset that cannot be used; the message names the file and line or the field."""


def build_messages(problem: Problem | str, system_prompt: str | None) -> list[dict[str, str]]:
    """The chat form of a problem: optional system message, then the user's question."""
    text = problem.problem if isinstance(problem, Problem) else problem
    messages: list[dict[str, str]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": text})
    return messages


# ---------------------------------------------------------------------------
# Synthetic arithmetic
# ---------------------------------------------------------------------------


def _apply(left: int, operator: str, right: int) -> int:
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    raise ValueError(f"unknown operator {operator!r}")


def solve_steps(operands: list[int], operators: list[str]) -> tuple[list[tuple[int, str, int, int]], int]:
    """Evaluate with the usual precedence, one binary operation per step.

    Multiplications first (left to right), then additions and subtractions left
    to right — each step `(a, op, b, result)` is small enough for a tiny model."""
    values = list(operands)
    ops = list(operators)
    steps: list[tuple[int, str, int, int]] = []
    while "*" in ops:
        i = ops.index("*")
        result = values[i] * values[i + 1]
        steps.append((values[i], "*", values[i + 1], result))
        values[i : i + 2] = [result]
        del ops[i]
    while ops:
        result = _apply(values[0], ops[0], values[1])
        steps.append((values[0], ops[0], values[1], result))
        values[0:2] = [result]
        del ops[0]
    return steps, values[0]


def format_expression(operands: list[int], operators: list[str]) -> str:
    parts = [str(operands[0])]
    for operator, operand in zip(operators, operands[1:]):
        parts.append(f" {operator} {operand}")
    return "".join(parts)


def column_step(a: int, operator: str, b: int) -> str:
    """One step worked in columns, units first, so every fact the model needs is a
    one-digit lookup next to its inputs: `06 + 18: 6+8=14, 0+1+1=2, so 24`.

    A small model learns these ~200 digit facts from a few thousand examples and
    they cover every problem, held-out ones included; whole-problem answers would
    each have to be memorised. Negative operands and `*` stay one line (`a op b = r`)."""
    result = _apply(a, operator, b)
    if a < 0 or b < 0 or operator == "*":
        return f"{a} {operator} {b} = {result}"
    if operator == "-" and a < b:
        return _negative_difference(a, b)
    width = max(len(str(a)), len(str(b)))
    top, bottom = str(a).zfill(width), str(b).zfill(width)
    columns = []
    carry = 0
    for top_digit, bottom_digit in zip(reversed(top), reversed(bottom)):
        x, y = int(top_digit), int(bottom_digit)
        if operator == "+":
            total = x + y + carry
            columns.append(f"{x}+{y}{'+1' if carry else ''}={total}")
            carry, digit = divmod(total, 10)
        else:
            needed = y + carry
            if x >= needed:
                digit, next_carry = x - needed, 0
                columns.append(f"{x}-{y}{'-1' if carry else ''}={digit}")
            else:
                digit, next_carry = 10 + x - needed, 1
                columns.append(f"1{x}-{y}{'-1' if carry else ''}={digit}")
            carry = next_carry
    return f"{top} {operator} {bottom}: {', '.join(columns)}, so {result}"


def _negative_difference(a: int, b: int) -> str:
    """`a - b` with a < b: worked as -(b - a)."""
    positive = column_step(b, "-", a)
    head, tail = positive.split(": ", 1)
    return f"-({head}): {tail.rsplit(', so ', 1)[0]}, so {a - b}"


def format_solution(steps: list[tuple[int, str, int, int]], answer: int) -> str:
    """The reference response the warm start imitates: one line per step, then the box."""
    lines = [column_step(a, op, b) for a, op, b, _ in steps]
    lines.append(f"\\boxed{{{answer}}}")
    return "\n".join(lines)


def make_arithmetic_problem(operands: list[int], operators: list[str]) -> Problem:
    expression = format_expression(operands, operators)
    steps, answer = solve_steps(operands, operators)
    return Problem(
        id=f"arith:{expression.replace(' ', '')}",
        problem=f"Compute {expression}.",
        answer=str(answer),
        source="synthetic",
        meta={"operands": list(operands), "operators": list(operators)},
        solution=format_solution(steps, answer),
    )


def _space_size(config: TaskConfig) -> int:
    span = config.max_operand - config.min_operand + 1
    return span**config.num_terms * len(set(config.operators)) ** (config.num_terms - 1)


def synthetic_train_count(config: TaskConfig) -> int:
    """Distinct training prompts `load_task` makes for a synthetic task: `train_size`, capped by
    the problem space left after the held-out problems (the platform checks a run against it)."""
    return max(0, min(config.train_size, _space_size(config) - config.heldout_size))


def _draw(rng: random.Random, config: TaskConfig) -> Problem:
    operands = [rng.randint(config.min_operand, config.max_operand) for _ in range(config.num_terms)]
    operators = [rng.choice(config.operators) for _ in range(config.num_terms - 1)]
    return make_arithmetic_problem(operands, operators)


def synthetic_problems(config: TaskConfig, count: int, *, stream: str, exclude: set[str] | None = None) -> list[Problem]:
    """`count` distinct problems from the seeded stream `stream` ("train"/"heldout"), skipping `exclude` ids."""
    exclude = exclude or set()
    available = _space_size(config) - len(exclude)
    if count > available:
        raise TaskDataError(
            f"task: asked for {count} distinct {stream} problems but operands "
            f"{config.min_operand}..{config.max_operand}, num_terms={config.num_terms}, operators={config.operators} "
            f"allow only {available} (raise task.max_operand or task.num_terms, or lower task.heldout_size/task.train_size)"
        )
    rng = random.Random(f"{config.seed}:{stream}")
    seen: set[str] = set()
    out: list[Problem] = []
    # Rejection sampling is fine while count is a modest fraction of the space;
    # for a nearly exhausted space fall back to enumerating what is left.
    attempts = 0
    while len(out) < count and attempts < 50 * count + 1000:
        attempts += 1
        problem = _draw(rng, config)
        if problem.id in seen or problem.id in exclude:
            continue
        seen.add(problem.id)
        out.append(problem)
    if len(out) < count:
        out.extend(_enumerate_rest(config, count - len(out), seen | exclude, rng))
    return out


def _enumerate_rest(config: TaskConfig, count: int, taken: set[str], rng: random.Random) -> list[Problem]:
    import itertools

    span = range(config.min_operand, config.max_operand + 1)
    operators = sorted(set(config.operators))
    rest = []
    for operands in itertools.product(span, repeat=config.num_terms):
        for ops in itertools.product(operators, repeat=config.num_terms - 1):
            problem = make_arithmetic_problem(list(operands), list(ops))
            if problem.id not in taken:
                rest.append(problem)
    rng.shuffle(rest)
    return rest[:count]


# ---------------------------------------------------------------------------
# Math JSONL datasets
# ---------------------------------------------------------------------------


def load_jsonl_problems(path: str | Path, *, max_rows: int | None = None) -> list[Problem]:
    """Rows of the shared-data schema. A row missing `problem` or `answer` is an error naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"dataset file not found: {path}")
    problems: list[Problem] = []
    seen_ids: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskDataError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise TaskDataError(f"{path}:{line_number}: expected a JSON object per line")
            problems.append(_row_to_problem(row, f"{path}:{line_number}", default_id=f"{path.stem}-{line_number}"))
            if problems[-1].id in seen_ids:
                raise TaskDataError(f"{path}:{line_number}: duplicate id {problems[-1].id!r}")
            seen_ids.add(problems[-1].id)
            if max_rows is not None and len(problems) >= max_rows:
                break
    if not problems:
        raise TaskDataError(f"{path}: no rows")
    return problems


def _row_to_problem(row: dict[str, Any], where: str, *, default_id: str) -> Problem:
    # GSM8K-style rows name the statement `question`; accept it, but nothing else is guessed.
    problem = row.get("problem", row.get("question"))
    answer = row.get("answer")
    if not isinstance(problem, str) or not problem.strip():
        raise TaskDataError(f"{where}: row has no 'problem' text")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise TaskDataError(f"{where}: row has no 'answer'")
    meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
    return Problem(
        id=str(row.get("id", default_id)),
        problem=problem,
        answer=str(answer).strip(),
        source=str(row.get("source", "")),
        meta=meta,
        solution=row.get("solution") if isinstance(row.get("solution"), str) else None,
    )


def load_hub_problems(dataset_id: str, split: str = "train") -> list[Problem]:
    """A HF hub dataset (only where the `datasets` package is installed and a hub is reachable)."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise TaskDataError(
            f"{dataset_id!r} is not a local file, and loading hub datasets needs the `datasets` package "
            "(not installed here); point task.train_path at a JSONL file instead"
        ) from exc
    try:
        rows = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:  # network, missing dataset, bad split: all mean "cannot use it"
        raise TaskDataError(f"cannot load hub dataset {dataset_id!r} (split {split!r}): {exc}") from exc
    return [_row_to_problem(dict(row), f"{dataset_id}[{index}]", default_id=f"{dataset_id}-{index}") for index, row in enumerate(rows)]


def load_problems(path_or_id: str, *, max_rows: int | None = None) -> list[Problem]:
    """A local JSONL path, else (if it looks like `owner/name`) a hub dataset id."""
    path = Path(path_or_id)
    if path.suffix == ".jsonl" or path.exists():
        return load_jsonl_problems(path, max_rows=max_rows)
    if path_or_id.count("/") == 1 and not path_or_id.startswith((".", "/")):
        problems = load_hub_problems(path_or_id)
        return problems[:max_rows] if max_rows else problems
    raise TaskDataError(f"dataset file not found: {path_or_id}")


# ---------------------------------------------------------------------------
# The task as the actor sees it
# ---------------------------------------------------------------------------


@dataclass
class TaskData:
    train: list[Problem]  # one epoch of training prompts, in file/draw order
    heldout: list[Problem]  # never trained on; the success-rate curve
    seed: int = 0
    system_prompt: str = ""

    def epoch(self, index: int) -> list[Problem]:
        """Epoch `index`'s training order: the same prompts each epoch, freshly (and reproducibly) shuffled."""
        order = list(self.train)
        random.Random(f"{self.seed}:epoch:{index}").shuffle(order)
        return order

    def train_stream(self, start_epoch: int = 0) -> Iterator[tuple[int, Problem]]:
        """Endless `(epoch, problem)` pairs, epoch after epoch."""
        epoch = start_epoch
        while True:
            for problem in self.epoch(epoch):
                yield epoch, problem
            epoch += 1

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return build_messages(problem, self.system_prompt)


def load_task(config: TaskConfig) -> TaskData:
    if config.kind == "synthetic":
        heldout = synthetic_problems(config, config.heldout_size, stream="heldout")
        train_size = synthetic_train_count(config)
        train = synthetic_problems(config, train_size, stream="train", exclude={p.id for p in heldout})
        return TaskData(train=train, heldout=heldout, seed=config.seed, system_prompt=config.system_prompt)
    assert config.train_path is not None  # the config validator guarantees it
    train = load_problems(config.train_path)
    if config.eval_path:
        heldout = load_problems(config.eval_path)[: config.heldout_size]
    else:
        # No separate eval file: hold out a seeded slice of the training rows.
        if len(train) <= config.heldout_size:
            raise TaskDataError(
                f"task.train_path has {len(train)} rows, not more than task.heldout_size={config.heldout_size}; "
                "set task.eval_path or lower task.heldout_size"
            )
        shuffled = list(train)
        random.Random(f"{config.seed}:heldout").shuffle(shuffled)
        heldout = shuffled[: config.heldout_size]
        heldout_ids = {p.id for p in heldout}
        train = [p for p in train if p.id not in heldout_ids]
    return TaskData(train=train, heldout=heldout, seed=config.seed, system_prompt=config.system_prompt)
