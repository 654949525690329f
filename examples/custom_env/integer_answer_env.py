"""An example custom environment (`env.name: custom`): math where only a plain integer counts.

A run names it as `env.class_path: integer_answer_env:IntegerAnswerEnvironment`, and the operator
allows this folder: `INFLIGHT_ENV_ROOTS=examples/custom_env` (os.pathsep-separated, like PATH). The
class runs inside the actor, so nothing outside those folders is ever imported
(`rl_core/envs/environments.py`). `examples/tiny-cpu-custom-env.yaml` is a run with it.

It keeps today's prompts and turns (`MathEnvironment`) and changes only the reward: the last
`\\boxed{}` must be an integer written plainly (`42`, not `42.0` or `\\frac{84}{2}`) and equal the
reference. A stricter format is a way to teach a policy one answer style.
"""

from __future__ import annotations

import re

from rl_core.envs.environments import MathEnvironment
from rl_core.envs.problems import Problem
from rl_core.envs.rewards import RewardResult, extract_last_boxed

INTEGER = re.compile(r"-?[0-9]+")


class IntegerAnswerEnvironment(MathEnvironment):
    name = "integer_answer"

    def score(self, problem: Problem, texts: list[str]) -> list[RewardResult]:
        results = []
        for text in texts:
            extracted = extract_last_boxed(text)
            correct = extracted is not None and bool(INTEGER.fullmatch(extracted.strip())) and (
                extracted.strip() == problem.answer.strip())
            results.append(RewardResult(reward=float(correct), success=correct, extracted=extracted))
        return results
