"""Held-out and benchmark evaluation: mean@k / pass@k with a standard error, per-problem results.

- `evaluator`: evaluating a policy through the inference contract
- `cli`: `python -m rl_core eval`

May import: the stages below (`common` … `inference`).
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
