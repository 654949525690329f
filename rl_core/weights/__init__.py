"""In-flight weight updates from the trainer to the inference servers.

- `sync`: the process-group broadcast (trainer rank 0 → servers)
- `handoff`: the same-device handoff (shared memory / CUDA IPC)
- `segments`: names and clean-up of the handoff's shared-memory segments

May import: the stages below (`common` … `models`).
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
