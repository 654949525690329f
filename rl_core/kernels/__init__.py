"""The compute kernels the engine and the trainer share.

- `cpu`: linear layers on oneDNN on the CPU
- `attention`: sdpa under an explicit mask, GQA on CUDA
- `packed_attention`: attention over a packed training micro-batch at the cost of what each token may see

May import: `common`, `config`, `rundir`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
