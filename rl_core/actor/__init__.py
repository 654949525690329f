"""The rollout actor: prompt groups in flight, scored, written to the stream.

- `loop`: the actor's loop
- `main`: the actor's process (`python -m rl_core actor`)
- `submission`: what is submitted and when: order, throttle, eval schedule
- `lag_throttle`: the `max_lag` bound kept at submission
- `scheduling`: routing across servers (least-loaded, HistoPipe)
- `tail_batching`: RollPacker's tail batching
- `discarded`: the samples the actor did not write to the stream, with why (the rollout viewer)
- `lag_prediction`: the policy lag a config should see, predicted before launch (torch-free: the create page)

May import: the stages below (`common` … `evaluation`); never `trainer` or `launch`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
