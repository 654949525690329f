"""The reference engine's speculative decoding (HistoSpec's verify path) against Hugging Face on
the tiny model: lossless greedy, draft lengths, the CPU draft budget, seeded sampling, the verify
rule keeping the target distribution, a weight update mid-speculation. HistoSpec's own index is
tested in test_speculation.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.common.contracts import SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine
from rl_core.inference.sampling import verify_draft, verify_drafts, width_groups
from rl_core.inference.speculation import DraftLengthController

from engine_testing import (  # noqa: F401 - fixtures used by name; tests/rl_core is on sys.path
    GREEDY, continue_on_old_cache, engine, hf_greedy, hf_model, model_dir, perturbed_state, prompts, wait_for,
)


class ScriptedDrafter:
    """A drafter that proposes a fixed continuation per history key: the engine's verify
    path is what is under test here (HistoSpec's own index is tested in test_speculation)."""

    def __init__(self, scripts: dict[str, list[int]]) -> None:
        self.scripts = scripts
        self.calls = 0
        self.responses: dict[str, list[list[int]]] = {}

    def draft(self, history_key: str, generated_token_ids: list[int], max_tokens: int) -> list[int]:
        self.calls += 1
        script = self.scripts[history_key]
        done = len(generated_token_ids)
        return script[done : done + max_tokens]

    def add_response(self, history_key: str, token_ids: list[int]) -> None:
        self.responses.setdefault(history_key, []).append(token_ids)


def test_speculative_greedy_is_lossless(model_dir: Path, hf_model, prompts) -> None:
    expected = [hf_greedy(hf_model, prompt, 30) for prompt in prompts[:3]]
    wrong = [(token + 1) % 1000 for token in expected[1]]
    drafter = ScriptedDrafter({"right": expected[0], "wrong": wrong, "half": expected[2][:10] + wrong[10:]})
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=4), drafter=drafter)
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    with engine:
        futures = [
            engine.submit(prompts[0], params, history_key="right"),
            engine.submit(prompts[1], params, history_key="wrong"),
            engine.submit(prompts[2], params, history_key="half"),
            engine.submit(prompts[3], params),  # no history key: plain decoding alongside
        ]
        results = [future.result(timeout=120) for future in futures]
    for result, tokens in zip(results, expected + [hf_greedy(hf_model, prompts[3], 30)]):
        assert result.token_ids == tokens
        assert len(result.logprobs) == len(result.token_versions) == len(tokens)
    stats = engine.stats()
    assert stats["spec_accepted_tokens"] >= len(expected[0]) - 3  # the right script is nearly all accepted
    assert stats["spec_drafted_tokens"] > stats["spec_accepted_tokens"]  # the wrong one is rejected
    # Fully accepted drafts double in length, so the verify steps are far fewer than the tokens.
    assert stats["spec_verify_steps"] < 3 * 30
    assert drafter.responses["right"] == [expected[0]]
    # Logprobs of accepted draft tokens are the target's own.
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompts[0] + expected[0]])).logits[0].float()
    reference = torch.log_softmax(logits[len(prompts[0]) - 1 : -1], dim=-1)
    for step, token in enumerate(expected[0]):
        assert results[0].logprobs[step] == pytest.approx(float(reference[step, token]), abs=1e-4)


def test_engine_draft_lengths_follow_the_draft_length_controller(model_dir: Path, hf_model, prompts) -> None:
    """The engine's adaptive draft length is `speculation.DraftLengthController`: replaying each
    sequence's verify outcomes through a controller predicts every draft length it asks for."""

    class RecordingDrafter(ScriptedDrafter):
        def __init__(self, scripts: dict[str, list[int]]) -> None:
            super().__init__(scripts)
            self.asked: dict[str, list[tuple[int, int, int]]] = {}  # key -> (generated, max_tokens, drafted)

        def draft(self, history_key: str, generated_token_ids: list[int], max_tokens: int) -> list[int]:
            draft = super().draft(history_key, generated_token_ids, max_tokens)
            self.asked.setdefault(history_key, []).append((len(generated_token_ids), max_tokens, len(draft)))
            return draft

    max_new = 40
    expected = [hf_greedy(hf_model, prompt, max_new) for prompt in prompts[:2]]
    wrong = [(token + 1) % 1000 for token in expected[1]]
    mixed = [token if (index // 5) % 2 == 0 else wrong[index] for index, token in enumerate(expected[1])]
    drafter = RecordingDrafter({"right": expected[0] + [0] * max_new, "mixed": mixed + [0] * max_new})
    config = EngineConfig(max_batch_size=4, initial_draft_len=3, max_draft_len=8)
    engine = ReferenceEngine.from_pretrained(model_dir, config=config, drafter=drafter)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new)
    with engine:
        results = [
            engine.submit(prompts[0], params, history_key="right").result(timeout=120),
            engine.submit(prompts[1], params, history_key="mixed").result(timeout=120),
        ]
    assert [result.token_ids for result in results] == expected
    for key, result in zip(("right", "mixed"), results):
        asked = drafter.asked[key]
        controller = DraftLengthController(config.initial_draft_len, config.max_draft_len)
        lengths = []
        for (done, max_tokens, drafted), following in zip(asked, asked[1:] + [(len(result.token_ids), 0, 0)]):
            assert max_tokens == min(controller.length, max_new - done - 1)
            lengths.append(max_tokens)
            accepted = following[0] - done - 1  # tokens a verify step yields: accepted draft + one
            controller.update(drafted, accepted)
        if key == "right":
            assert lengths[:3] == [3, 6, 8]  # doubled up to the cap
        else:
            assert min(lengths) < 3  # halved on rejections


def test_a_cpu_engine_drafts_per_step_only_what_one_forward_overhead_is_worth(model_dir: Path, hf_model, prompts) -> None:
    """On a CPU every drafted token costs a decoded one, so unset the step's draft budget is
    `forward_overhead_tokens`, shared by the running sequences; set to 0 drafts are uncapped. The
    tokens are the greedy ones either way."""

    class StepCountingDrafter(ScriptedDrafter):
        engine: ReferenceEngine | None = None

        def __init__(self, scripts: dict[str, list[int]]) -> None:
            super().__init__(scripts)
            self.per_step: dict[int, int] = {}

        def draft(self, history_key: str, generated_token_ids: list[int], max_tokens: int) -> list[int]:
            draft = super().draft(history_key, generated_token_ids, max_tokens)
            step = int(self.engine.counters["steps"]) if self.engine else -1
            self.per_step[step] = self.per_step.get(step, 0) + len(draft)
            return draft

    expected = [hf_greedy(hf_model, prompt, 24) for prompt in prompts[:4]]
    most_per_step = {}
    for budget in (None, 0):
        drafter = StepCountingDrafter({str(index): tokens for index, tokens in enumerate(expected)})
        config = EngineConfig(max_batch_size=4, initial_draft_len=8, max_draft_len=8, forward_overhead_tokens=4,
                              spec_step_token_budget=budget)
        engine = ReferenceEngine.from_pretrained(model_dir, config=config, drafter=drafter)
        drafter.engine = engine
        assert engine.draft_token_budget == (4 if budget is None else 0)
        params = SamplingParams(temperature=0.0, max_new_tokens=24)
        with engine:
            futures = [engine.submit(prompt, params, history_key=str(index)) for index, prompt in enumerate(prompts[:4])]
            assert [future.result(timeout=120).token_ids for future in futures] == expected
        most_per_step[budget] = max(drafter.per_step.values())
    assert most_per_step[None] <= 4 < most_per_step[0]


def test_speculative_sampling_is_seeded_and_well_formed(model_dir: Path, prompts) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=7)
    drafter = ScriptedDrafter({"k": list(range(5, 45))})
    engine = ReferenceEngine.from_pretrained(model_dir, drafter=drafter)
    with engine:
        first = engine.submit(prompts[0], params, history_key="k").result(timeout=60)
        second = engine.submit(prompts[0], params, history_key="k").result(timeout=60)
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) == 20 and all(lp <= 0 for lp in first.logprobs)
    assert engine.stats()["spec_drafted_tokens"] > 0


def test_verify_draft_sampling_keeps_the_target_distribution() -> None:
    # Statistical check of the acceptance rule itself on a known 5-token distribution:
    # the first emitted token must be distributed as p whatever the draft proposes.
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.2] * 5]))
    target = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    generator = torch.Generator().manual_seed(0)
    for proposed in (0, 3):
        counts = torch.zeros(5)
        trials = 20000
        for _ in range(trials):
            uniforms = torch.rand(3, generator=generator).tolist()
            tokens, logprobs, accepted = verify_draft(logits, [proposed], 1.0, 1.0, uniforms)
            counts[tokens[0]] += 1
            assert logprobs[0] == pytest.approx(math.log(float(target[tokens[0]])), abs=1e-5)
            assert len(tokens) == (2 if accepted == 1 else 1)
        assert torch.allclose(counts / trials, target, atol=0.015), (proposed, counts / trials)


def test_speculation_across_a_weight_update(model_dir: Path, hf_model, prompts) -> None:
    # Drafts come from the old policy's answer; after the update they are mostly wrong,
    # and verification must use the new weights on the cache built so far.
    old = hf_model
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new_state = perturbed_state(old, seed=3)
    new.load_state_dict(new_state, strict=False)
    prompt = prompts[1]
    drafter = ScriptedDrafter({"p": hf_greedy(old, prompt, 80)})
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=2, max_draft_len=4), drafter=drafter)
    with engine:
        future = engine.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=80), history_key="p")
        wait_for(lambda: engine.stats()["generated_tokens"] >= 4)
        engine.update_weights(new_state.items(), version=1)
        result = future.result(timeout=120)
    assert set(result.token_versions) == {0, 1}
    switch = result.token_versions.index(1)
    assert result.token_ids == continue_on_old_cache(old, new, prompt, result.token_ids, switch)
    assert engine.stats()["spec_accepted_tokens"] > 0


def test_batched_verify_matches_row_by_row() -> None:
    # The engine verifies every speculating row of a forward at once; each row must come out
    # exactly as verifying it alone (same tokens, logprobs, accepted count, same uniforms used).
    generator = torch.Generator().manual_seed(1)
    keep, vocab = 6, 11
    logits = torch.randn(6, keep, vocab, generator=generator) * 2
    best = logits.argmax(dim=-1).tolist()
    drafts = [best[0][:5], [3, 4], [], best[3][2:4] + [0], [7] * 5, best[5][4:5]]
    temperatures = [0.0, 0.0, 1.0, 1.0, 0.7, 1.0]
    top_ps = [1.0, 1.0, 1.0, 0.9, 1.0, 1.0]
    uniforms = [torch.rand(2 * len(d) + 1, generator=generator).tolist() if t > 0 else [] for d, t in zip(drafts, temperatures)]
    batched = verify_drafts(logits, drafts, temperatures, top_ps, uniforms)
    for row, (draft, temperature, top_p, row_uniforms) in enumerate(zip(drafts, temperatures, top_ps, uniforms)):
        alone = verify_draft(logits[row, keep - len(draft) - 1 :], draft, temperature, top_p, row_uniforms)
        assert batched[row][0] == alone[0] and batched[row][2] == alone[2]
        assert batched[row][1] == pytest.approx(alone[1], abs=1e-6)
    assert batched[0][2] == len(drafts[0]) == 5  # a greedy draft equal to the argmax is accepted whole


def test_width_groups_splits_only_when_padding_costs_more_than_a_forward() -> None:
    # 60 one-token decodes and 4 seventeen-token verifies: padding them together would feed
    # 64 x 17 tokens, two forwards feed 60 + 68 plus one overhead.
    assert width_groups([1] * 60 + [17] * 4, overhead_tokens=16) == [list(range(60)), [60, 61, 62, 63]]
    assert width_groups([1, 1, 2, 2, 3], overhead_tokens=16) == [[0, 1, 2, 3, 4]]  # splitting saves < 16
    assert width_groups([30, 1, 31, 1], overhead_tokens=16) == [[1, 3], [0, 2]]
    assert width_groups([5, 1], overhead_tokens=0) == [[1], [0]]
    assert sorted(sum(width_groups([3, 9, 1, 17, 2, 2, 5], 4), [])) == list(range(7))  # every row exactly once
    assert width_groups([], 16) == []
