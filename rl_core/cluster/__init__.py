"""Where a run's processes go: GPU placement on one node, node layout and Ray for several.

- `placement`: which process sees which GPUs on one node, and which weight path it gets
- `role_hosts`: where the launcher's children run (local or Ray)
- `layout`: which node each role goes on
- `nodes`: `python -m rl_core cluster-nodes`: the Ray cluster's node table
- `ray_placement`: the Ray side of a cluster run
- `role_actor`: the small Ray actor running one node's roles

May import: the stages below (`common` … `weights`). Decides from the config only; starts nothing of the engine.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
