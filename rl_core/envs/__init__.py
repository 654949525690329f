"""What the policy is asked and how an answer is scored: problems, rewards, group advantages.

- `problems`: the training problems and reference answers (was rl_core/tasks.py, renamed so it is not confused with workers/tasks.py)
- `rewards`: math-verify on the last boxed answer, with a hard timeout
- `advantages`: group-relative advantages (GRPO-style)

May import: `common`, `config`, `rundir`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
