"""The trainer: stream → optimizer batches → loss → step → in-flight weight update.

- `loop`: the trainer's loop and process (`python -m rl_core trainer`)
- `loss`: the learning signal's data path: packing, log-probabilities
- `losses`: the policy objectives (`trainer.loss`) and importance corrections
- `torch_backend`: the plain-torch backend
- `deepspeed_backend`: the DeepSpeed ZeRO backend
- `train_records`: per-token log-probabilities for the rollout viewer
- `token_trie`: a prompt unit's tokens as a trie

May import: the stages below (`common` … `evaluation`); never `actor` or `launch`.
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
