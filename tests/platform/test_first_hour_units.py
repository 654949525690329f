"""The small rules behind issue 26's pages, each on its own: which part of a prompt the rollout
table shows, which figure the leaderboard sorts by when asked for none, the run list's sparkline.
The pages themselves are tested in a browser (test_first_hour_browser.py)."""

from __future__ import annotations

from typing import Sequence

from inflight.rollouts.tokens import TokenDecoder, problem_text
from inflight.runs.selectors import DEFAULT_SORT_PREFERENCE, default_leaderboard_sort
from inflight.web.templatetags.inflight_ui import sparkline


class TextDecoder(TokenDecoder):
    """A decoder whose "token ids" are the characters of a known text (specials kept or not)."""

    def __init__(self, text: str, without_specials: str) -> None:
        super().__init__(None)
        self.with_specials, self.without_specials = text, without_specials

    def text(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.without_specials if skip_special else self.with_specials


def test_the_table_shows_the_problem_not_the_system_prompt() -> None:
    chatml = "<|im_start|>system\nBe careful.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert problem_text(TextDecoder(chatml, "system\nBe careful.\nuser\nWhat is 2 + 3?\nassistant\n"), [1]) == "What is 2 + 3?"
    llama = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe careful.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nSolve x + 1 = 2.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert problem_text(TextDecoder(llama, ""), [1]) == "Solve x + 1 = 2."
    # A template it does not know: the whole prompt, as before.
    assert problem_text(TextDecoder("Q: 2 + 3 = ?\nA:", "Q: 2 + 3 = ?\nA:"), [1]) == "Q: 2 + 3 = ?\nA:"


def figures_present(*rows: dict[str, float | None]) -> tuple[dict[str, int], int]:
    """Per sort key, how many of these leaderboard rows have a figure (as the page counts them)."""
    return {key: sum(row.get(key) is not None for row in rows) for key in DEFAULT_SORT_PREFERENCE}, len(rows)


def test_the_default_sort_is_a_figure_every_listed_run_has() -> None:
    both = {"heldout_last": 0.5, "math500_last": 0.3, "aime24_last": None, "success_recent": 0.4}
    no_heldout = {"heldout_last": None, "math500_last": 0.2, "aime24_last": 0.1, "success_recent": 0.6}
    assert default_leaderboard_sort(*figures_present(both, both)) == "-heldout_last"
    assert default_leaderboard_sort(*figures_present(both, no_heldout)) == "-math500_last"  # the first every run has
    only_train = {"heldout_last": None, "math500_last": None, "aime24_last": None, "success_recent": 0.2}
    assert default_leaderboard_sort(*figures_present(only_train, no_heldout)) == "-success_recent"
    assert default_leaderboard_sort(*figures_present()) == "-heldout_last"


def test_sparkline_is_numbers_only_svg() -> None:
    svg = str(sparkline([0.1, 0.5, float("nan"), 0.3]))
    assert svg.startswith("<svg") and 'points="1.0,26.0 60.0,2.0 119.0,14.0"' in svg  # the NaN left out
    assert "from 0.1 to 0.3" in svg
    assert "—" in str(sparkline([0.2])) and "—" in str(sparkline(None))
    assert "<script" not in str(sparkline(["<script>", 1, 2]))
