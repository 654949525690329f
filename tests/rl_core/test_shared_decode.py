"""Decode rows shared by sequences with identical histories (rl_core/inference/shared_decode.py): the
engine with sharing gives exactly what it gives without, and never groups what may differ."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rl_core.common.contracts import GenerationResult, SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine
from rl_core.inference.shared_decode import extended_history_hash, prompt_history_hash, representatives


def run(model_dir: Path, share: bool, requests: list[tuple[list[int], SamplingParams]]) -> tuple[list[GenerationResult], int]:
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=32, initial_cache_len=16, share_identical_decodes=share))
    with engine:
        futures = [engine.submit(prompt, params) for prompt, params in requests]
        results = [future.result(timeout=120) for future in futures]
        return results, int(engine.stats()["decode_rows_shared"])


def common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def test_samples_of_one_prompt_share_rows_and_yield_what_unshared_decoding_yields(tiny_model: Path) -> None:
    # The demo's warm-started model on held-out problems at T=1: a group's samples agree on their
    # first tokens, then drift apart.
    from rl_core.config.run_config import TaskConfig
    from rl_core.envs.problems import build_messages, load_task

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = TaskConfig()
    prompts = [list(tokenizer.apply_chat_template(build_messages(problem, config.system_prompt), add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)) for problem in load_task(config).heldout[:2]]
    requests = []
    for p, prompt in enumerate(prompts):
        for sample in range(6):
            # One stops earlier by length, one has an extra stop token: members finish on their own.
            params = SamplingParams(temperature=1.0, max_new_tokens=6 if sample == 0 else 48, seed=100 * p + sample,
                                    stop_token_ids=[tokenizer.encode("+")[0]] if sample == 1 else [])
            requests.append((prompt, params))
        requests.append((prompt, SamplingParams(temperature=0.0, max_new_tokens=24)))
        requests.append((prompt, SamplingParams(temperature=0.0, max_new_tokens=24)))
    plain, plain_shared = run(tiny_model, False, requests)
    shared, rows_shared = run(tiny_model, True, requests)
    assert plain_shared == 0 and rows_shared > 20
    for a, b in zip(plain, shared):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # Not vacuous: some samples shared a stretch of tokens and then went separate ways (the copied
    # K/V carried them on), and the two greedy requests of a prompt stayed together to the end.
    sampled = [result.token_ids for result in shared[:6] + shared[8:14]]
    assert any(2 <= common_prefix(x, y) < min(len(x), len(y)) for x in sampled for y in sampled if x is not y)
    assert shared[6].token_ids == shared[7].token_ids and len(shared[6].token_ids) > 2


@dataclass
class Seq:
    prompt_token_ids: list[int]
    token_ids: list[int]
    admitted_step: int
    cache_len: int = 0
    history_hash: int = field(default=0)

    def __post_init__(self) -> None:
        self.history_hash = prompt_history_hash(self.prompt_token_ids)
        for token in self.token_ids:
            self.history_hash = extended_history_hash(self.history_hash, token)
        self.cache_len = len(self.prompt_token_ids) + len(self.token_ids) - 1


def test_only_the_same_history_admitted_in_the_same_step_is_grouped() -> None:
    seqs = [
        Seq([1, 2, 3], [7, 8], admitted_step=4),
        Seq([1, 2, 3], [7, 8], admitted_step=4),  # the same: grouped with the first
        Seq([1, 2, 3], [7, 9], admitted_step=4),  # another token
        Seq([1, 2, 3], [7, 8], admitted_step=5),  # admitted a step later: maybe other weights
        Seq([1, 2, 4], [7, 8], admitted_step=4),  # another prompt
        Seq([1, 2, 3], [7, 9], admitted_step=4),  # the same as the third
    ]
    assert representatives(seqs) == [0, 0, 2, 3, 4, 2]


def test_a_hash_collision_never_groups_different_histories() -> None:
    first, second = Seq([1, 2, 3], [7, 8], admitted_step=0), Seq([1, 2, 3], [8, 7], admitted_step=0)
    second.history_hash = first.history_hash  # as if the hashes collided
    assert representatives([first, second]) == [0, 1]
