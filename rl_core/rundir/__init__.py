"""The run directory (`--out DIR`): its layout and every record written into it.

- `layout`: the one owner of the directory's file names and how records are written
- `stream`: the durable actor → trainer stream of samples
- `resume`: resuming a run: refuse loudly when a checkpoint cannot be used
- `metrics`: metrics sinks (`metrics.jsonl`, mirrors)
- `heartbeats`: a role's heartbeat file, written by a thread of the role
- `role_args`: the command-line flags every role shares (`--run-dir`, `--servers`, `--await-servers`), written by the launcher
- `timeline`: the pipeline's timeline, each role's spans over wall time (run page's Timeline)

May import: `common`, `config`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
