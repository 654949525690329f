"""Token ids → text for the viewer, with the `tokenizers` library only (no torch, no transformers).

The worker decodes at ingest (it runs beside the model files; the web server may not), so
the database holds text and the pages never need the tokenizer.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from django.conf import settings

logger = logging.getLogger(__name__)


class TokenDecoder:
    def __init__(self, tokenizer: object | None) -> None:
        self.tokenizer = tokenizer

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """One text piece per id (byte-level pieces of a multi-byte character may show as �)."""
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids]
        return list(self.tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False))

    def text(self, ids: Sequence[int], skip_special: bool = False) -> str:
        if self.tokenizer is None:
            return " ".join(f"<{i}>" for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)


@lru_cache(maxsize=16)
def decoder_for_model(model_path: str) -> TokenDecoder:
    """The tokenizer of a local model directory; ids shown as `<id>` when there is none (a hub
    id the worker has not downloaded): the viewer still works, only less readable."""
    path = Path(model_path)
    if not path.is_absolute():
        path = settings.REPO_ROOT / path
    file = path / "tokenizer.json"
    if not file.is_file():
        logger.warning("no tokenizer.json under %s: rollouts are shown as token ids", path)
        return TokenDecoder(None)
    from tokenizers import Tokenizer

    return TokenDecoder(Tokenizer.from_file(str(file)))
