"""The floor every stage stands on: the data contracts between stages and process plumbing.

- `contracts`: the data passed between stages (requests, samples, weight-update notices), as pydantic models
- `processes`: process plumbing: event loops, exec-under-a-parent, signal handling
- `jsonl_tail`: reading a JSONL file while another process appends to it
- `system_metrics`: CPU/GPU/memory samples the launcher writes beside the run's metrics
- `metric_names`: the one owner of metric names read in more than one place (torch-free: the platform and CLI import it)

May import: nothing of rl_core.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
