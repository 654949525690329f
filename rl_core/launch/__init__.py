"""Starting and supervising a whole run: the launcher, its watchdog, what ran it.

- `launcher`: `python -m rl_core run`: validate, place, start servers/trainer/actor, supervise
- `preflight`: what is checked before a run starts (model, task, benchmarks, placement) and its run directory prepared
- `child_specs`: each server's and trainer rank's command and environment (pure)
- `watchdog`: whether every role still answers
- `provenance`: the code version, packages, host and command of a run

May import: every other stage. Nothing in rl_core imports it.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
