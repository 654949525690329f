"""What the policy is asked and how an answer is scored: problems, rewards, group advantages.

- `problems`: the training problems and reference answers (was rl_core/tasks.py, renamed so it is not confused with workers/tasks.py)
- `rewards`: math-verify on the last boxed answer, with a hard timeout
- `advantages`: group-relative advantages (GRPO-style)
- `environments`: the `Environment` interface (`env.name`): single-turn math, math with a Python tool, custom classes from INFLIGHT_ENV_ROOTS
- `trajectories`: multi-turn trajectories (model turns, tool turns, masks, per-token versions), for the actor and the evaluator
- `sandbox`: the sandbox a policy's Python tool calls run in (`ProcessSandbox`, `CommandSandbox`, `run_python`)
- `sandbox_exec`: the sandbox's launcher, run by path inside each call's process (stdlib only): namespaces, rlimits, privilege drop, audit hook

May import: `common`, `config`, `rundir`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
