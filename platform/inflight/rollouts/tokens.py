"""Token ids → text for the viewer, with the `tokenizers` library only (no torch, no transformers).

The worker decodes at ingest (it runs beside the model files; the web server may not), so
the database holds text and the pages never need the tokenizer.
"""

from __future__ import annotations

import logging
import re
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


# The last user turn of a chat prompt, in the templates of the models the platform runs: ChatML
# (Qwen, the tiny model) and Llama 3's headers. The viewer's table shows this, the problem, not
# the system prompt that every prompt of a run starts with.
_USER_TURNS = (
    re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.S),
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)(?:<\|eot_id\|>|$)", re.S),
)


def problem_text(decoder: TokenDecoder, prompt_ids: Sequence[int]) -> str:
    """The problem a chat prompt asks (its last user message); the whole prompt without special
    tokens when the template is not one of `_USER_TURNS`."""
    with_specials = decoder.text(prompt_ids)
    for pattern in _USER_TURNS:
        turns = pattern.findall(with_specials)
        if turns:
            return turns[-1].strip()
    return decoder.text(prompt_ids, skip_special=True)


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
