"""Model files without a hub: the tiny demo model, published shapes, loading and saving.

- `tiny_model`: `python -m rl_core bootstrap-tiny`: the tiny demo policy built offline
- `tiny_tools_model`: `python -m rl_core bootstrap-tiny-tools`: its variant for the tools demo (2-digit products, a Python tool)
- `model_io`: the torch side of a model's files
- `model_shapes`: `python -m rl_core build-model --shape`: real shapes, random weights

May import: `common`, `config`, `rundir`, `envs`, `kernels`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
