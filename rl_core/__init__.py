"""Inflight's RL engine: asynchronous RL post-training of LLMs with in-flight weight updates.

Never imports Django: the platform drives it as a subprocess (`python -m rl_core run`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHECKOUT_ROOT", "__version__"]
__version__ = "0.1.0"
# The directory above this package: the checkout in a source tree (where `.venv-vllm` and `.git`
# live). Here, in the one module that never moves, so no stage counts its own folder depth.
CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
