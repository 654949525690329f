"""The run config: the typed schema every stage reads, and how a user's text becomes one.

- `run_config`: `RunConfig` and its sections, help text on every field
- `section`: the base class of every section
- `cluster`: the `cluster` section (one run across machines)
- `env`: the `env` section (single-turn math, a Python tool, or an operator-allowed class)
- `monitoring`: the `monitoring` section (rollouts kept, alert rules, metric mirrors, the hang limit)
- `engine`: the reference engine's settings
- `benchmarks`: the benchmark table (names, data files, default k)
- `files`: YAML loading with `--set` overrides, run defaults, errors naming the field, `python -m rl_core validate`

May import: `common`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
