"""Inflight's RL engine: asynchronous RL post-training of LLMs with in-flight weight updates.

Never imports Django: the platform drives it as a subprocess (`python -m rl_core run`).
"""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
