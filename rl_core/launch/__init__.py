"""Starting and supervising a whole run: the launcher, its watchdog, what ran it.

- `launcher`: `python -m rl_core run`: validate, place, start servers/trainer/actor, supervise
- `preflight`: what is checked before a run starts (model, task, benchmarks, placement) and its run directory prepared
- `child_specs`: each server's and trainer rank's command and environment (pure)
- `watchdog`: whether every role still answers
- `provenance`: the code version, packages, host and command of a run
- `role_forks`: the run's CPU roles forked from one interpreter that imported torch once (the standard library's fork server)
- `warm_roles`: imported first by that fork server: it hides the GPUs from itself

May import: every other stage. Nothing in rl_core imports it.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
