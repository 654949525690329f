"""ReferenceEngine against Hugging Face on the real tiny Qwen2 model (random weights).

Exactness is checked against `model.generate` / plain forwards of a separately
loaded copy of the same checkpoint, so the slot KV cache, the left-padded
batches and the 4-D masks all have to be right for these to pass. Speculative
decoding's verify path: test_engine_speculation.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.common.contracts import EVAL_PRIORITY, SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine

from engine_testing import (  # noqa: F401 - fixtures used by name; tests/rl_core is on sys.path
    GREEDY, continue_on_old_cache, engine, hf_greedy, hf_model, model_dir, perturbed_state, prompts, wait_for,
)


def test_greedy_batch_matches_hf_generate(engine: ReferenceEngine, hf_model, prompts) -> None:
    assert len({len(prompt) for prompt in prompts}) > 3  # really mixed lengths in one batch
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == hf_greedy(hf_model, prompt, GREEDY.max_new_tokens)
        assert result.prompt_token_ids == prompt
        assert result.finish_reason in ("stop", "length")
        assert result.token_versions == [0] * len(result.token_ids)
        assert all(logprob <= 0 for logprob in result.logprobs)
    # The KV cache started at 16 positions and had to grow mid-run.
    assert engine.stats()["kv_cache_capacity"] >= max(len(p) for p in prompts) + GREEDY.max_new_tokens


def test_greedy_logprobs_are_plain_log_softmax(engine: ReferenceEngine, hf_model, prompts) -> None:
    prompt = prompts[1]
    result = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6))[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + result.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for step, (token, logprob) in enumerate(zip(result.token_ids, result.logprobs)):
        assert logprob == pytest.approx(float(expected[step, token]), abs=1e-4)


def test_requests_join_a_running_batch(engine: ReferenceEngine, hf_model, prompts) -> None:
    long_params = SamplingParams(temperature=0.0, max_new_tokens=60)
    first = engine.submit(prompts[0], long_params)
    wait_for(lambda: engine.stats()["generated_tokens"] >= 5)
    assert not first.done()  # the newcomers really join while it decodes
    late = [engine.submit(prompt, GREEDY) for prompt in prompts[1:]]
    late_results = [future.result(timeout=120) for future in late]
    first_result = first.result(timeout=120)
    assert first_result.token_ids == hf_greedy(hf_model, prompts[0], 60)
    for prompt, result in zip(prompts[1:], late_results):
        assert result.token_ids == hf_greedy(hf_model, prompt, GREEDY.max_new_tokens)


def test_sequences_move_into_freed_slots_and_still_decode_exactly(engine: ReferenceEngine, hf_model, prompts) -> None:
    # Short requests in the low slots finish first; the long ones in the high slots move down
    # into the holes (their cached K/V copied) and must go on producing HF's exact tokens.
    budgets = [2, 40, 3, 40, 2]
    futures = [engine.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=budget))
               for prompt, budget in zip(prompts, budgets)]
    wait_for(lambda: all(futures[i].done() for i in (0, 2, 4)))
    wait_for(lambda: engine.stats()["generated_tokens"] >= sum(budgets[i] for i in (0, 2, 4)) + 2 * 6)
    with engine._cond:
        running_slots = sorted(seq.slot for seq in engine._running)
    assert running_slots in ([0, 1], [])  # the two long ones hold the lowest slots (or are done)
    for prompt, budget, future in zip(prompts, budgets, futures):
        assert future.result(timeout=120).token_ids == hf_greedy(hf_model, prompt, budget)


def test_decode_batches_stay_one_slot_range_while_groups_come_and_go(model_dir: Path, prompts) -> None:
    # Groups of 4 samples of one prompt arrive while others decode and finish at different
    # lengths: every decode forward must still cover one contiguous run of cache slots (a view),
    # never a scattered set (a gather of every sequence's K/V per layer). Shared decode rows are
    # off here: with them a forward covers only the stand-ins of identical histories (a few rows,
    # gathered), and the layout under test is that of the whole running set.
    engine = ReferenceEngine.from_pretrained(
        model_dir, config=EngineConfig(max_batch_size=16, initial_cache_len=16, share_identical_decodes=False))
    decode_slots: list[list[int]] = []
    prepare = engine.cache.prepare

    def recording(slots: list[int], write_source: torch.Tensor, *args: object) -> None:
        if len(write_source) == len(slots):  # one new token per row: a decode forward
            decode_slots.append(list(slots))
        prepare(slots, write_source, *args)

    engine.cache.prepare = recording  # type: ignore[method-assign]
    engine.start()
    try:
        futures = []
        for wave, prompt in enumerate(prompts):
            futures += [engine.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=4 + 7 * ((wave + i) % 3), seed=i))
                        for i in range(4)]
            wait_for(lambda: engine.stats()["generated_tokens"] >= 6 * (wave + 1))
        results = [future.result(timeout=120) for future in futures]
    finally:
        engine.stop()
    assert all(result.finish_reason == "length" for result in results)
    assert decode_slots and all(slots == list(range(slots[0], slots[0] + len(slots))) for slots in decode_slots)


def test_a_full_engine_admits_lower_priority_values_first(model_dir: Path, prompts) -> None:
    # Two slots, both busy; a rollout (priority 0) queues first, then an evaluation request
    # (EVAL_PRIORITY): the evaluation takes the first slot that frees although it came later.
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=2, initial_cache_len=16))
    engine.start()
    try:
        busy = [engine.submit(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=budget)) for budget in (3, 60)]
        wait_for(lambda: engine.stats()["running"] == 2)
        rollout = engine.submit(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=3))
        evaluation = engine.submit(prompts[2], SamplingParams(temperature=0.0, max_new_tokens=20, priority=EVAL_PRIORITY))
        evaluation.result(timeout=120)
        assert not rollout.done()  # FIFO would have served the 3-token rollout long before
        assert rollout.result(timeout=120).finish_reason == "length"
        for future in busy:
            future.result(timeout=120)
    finally:
        engine.stop()


def test_identical_prompts_share_the_prompt_cache(engine: ReferenceEngine, hf_model, prompts) -> None:
    # n samples of one prompt: submitted together, and one more while they decode.
    prompt = prompts[1]
    expected = hf_greedy(hf_model, prompt, GREEDY.max_new_tokens)
    together = [engine.submit(prompt, GREEDY) for _ in range(3)]
    seeded = SamplingParams(temperature=1.0, max_new_tokens=12, seed=21)
    alone = engine.generate([prompts[2]], seeded)[0]
    late = engine.submit(prompt, GREEDY)
    # Same seed: the follower samples from the shared cache exactly as the request did alone.
    seeded_pair = [engine.submit(prompts[2], seeded) for _ in range(2)]
    for future in together + [late]:
        assert future.result(timeout=120).token_ids == expected
    assert [future.result(timeout=120).token_ids for future in seeded_pair] == [alone.token_ids] * 2
    assert engine.stats()["prompt_tokens_shared"] >= 2 * (len(prompt) - 1)


def test_prompts_with_a_common_start_copy_it_and_compute_only_the_rest(engine: ReferenceEngine, hf_model, prompts) -> None:
    """Prompts of one task share their system prompt and template: admitted together, one is
    prefilled whole and the others copy its first tokens; admitted later, they copy them from a
    running sequence. Every answer is the one the prompt gets alone."""
    system = prompts[4] + prompts[1]  # a 20+-token common start, as a chat template's
    variants = [system + [40 + i, 41 + i] for i in range(3)]
    expected = [hf_greedy(hf_model, prompt, GREEDY.max_new_tokens) for prompt in variants + [system + [90]]]
    together = [engine.submit(prompt, GREEDY) for prompt in variants]
    wait_for(lambda: engine.stats()["generated_tokens"] > 0)
    late = engine.submit(system + [90], GREEDY)  # admitted while the others decode: copies from one of them
    assert [future.result(timeout=120).token_ids for future in together + [late]] == expected
    assert engine.stats()["prompt_tokens_shared"] >= 3 * len(system)
    assert engine.stats()["prompt_tokens"] == sum(len(prompt) for prompt in variants + [system + [90]])


def test_a_common_start_computed_before_a_weight_update_is_not_shared(engine: ReferenceEngine, model_dir: Path, prompts) -> None:
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    system = prompts[4] + prompts[1]
    engine.submit(system + [40], SamplingParams(temperature=0.0, max_new_tokens=200), request_id="long")
    wait_for(lambda: engine.stats()["generated_tokens"] > 0)
    assert engine.in_flight_ids() == ["long"]  # its prompt K/V (old weights) are in the cache
    new_state = perturbed_state(fresh, seed=2)
    engine.update_weights(new_state.items(), version=1)
    shared_before = engine.stats()["prompt_tokens_shared"]
    result = engine.generate([system + [41]], GREEDY)[0]
    fresh.load_state_dict(new_state, strict=False)
    assert result.token_ids == hf_greedy(fresh, system + [41], GREEDY.max_new_tokens)
    assert engine.stats()["prompt_tokens_shared"] == shared_before  # the old weights' K/V were not reused
    engine.abort("long")


def test_a_finished_turns_kv_is_kept_for_the_request_that_continues_it(engine: ReferenceEngine, hf_model, prompts) -> None:
    """A tool call's next turn: the prompt is the finished turn's prompt + tokens + the tool's output.
    Its history's K/V are copied from the finished turn (all but the last sampled token, whose K/V
    were never computed), and the answer is the one the whole prompt gets prefilled alone."""
    first = engine.generate([prompts[1]], GREEDY)[0]
    continuation = prompts[1] + first.token_ids + prompts[3]
    before = engine.stats()
    result = engine.generate([continuation], GREEDY)[0]
    after = engine.stats()
    assert result.token_ids == hf_greedy(hf_model, continuation, GREEDY.max_new_tokens)
    assert after["prompt_tokens_retained"] - before["prompt_tokens_retained"] == len(prompts[1]) + len(first.token_ids) - 1
    assert after["prompt_tokens_shared"] - before["prompt_tokens_shared"] == len(prompts[1]) + len(first.token_ids) - 1


def test_a_finished_turns_kv_from_older_weights_is_not_copied(engine: ReferenceEngine, model_dir: Path, prompts) -> None:
    """Neither a turn that finished before an update nor one that ran across it (its K/V are half
    old weights') lends its K/V: each continuation is prefilled whole at the new weights."""
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    before_update = engine.generate([prompts[1]], GREEDY)[0]
    across = engine.submit(prompts[4], SamplingParams(temperature=0.0, max_new_tokens=60))
    wait_for(lambda: engine.stats()["generated_tokens"] > len(before_update.token_ids))
    new_state = perturbed_state(fresh, seed=3)
    engine.update_weights(new_state.items(), version=1)
    across_update = across.result(timeout=120)
    assert set(across_update.token_versions) == {0, 1}
    fresh.load_state_dict(new_state, strict=False)
    for prompt, first in ((prompts[1], before_update), (prompts[4], across_update)):
        continuation = prompt + first.token_ids + prompts[3]
        assert engine.generate([continuation], GREEDY)[0].token_ids == hf_greedy(fresh, continuation, GREEDY.max_new_tokens)
    assert engine.stats()["prompt_tokens_retained"] == 0


def test_kept_turns_are_bounded_and_the_least_recently_kept_goes_first(model_dir: Path, hf_model, prompts) -> None:
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=4, initial_cache_len=16, retained_sequences=2))
    engine.start()
    try:
        firsts = [engine.generate([prompt], GREEDY)[0] for prompt in (prompts[1], prompts[3], prompts[4])]  # one after another
        retained = []
        for prompt, first in zip((prompts[1], prompts[4]), (firsts[0], firsts[2])):
            continuation = prompt + first.token_ids + prompts[2]
            before = engine.stats()["prompt_tokens_retained"]
            assert engine.generate([continuation], GREEDY)[0].token_ids == hf_greedy(hf_model, continuation, GREEDY.max_new_tokens)
            retained.append(engine.stats()["prompt_tokens_retained"] - before)
        assert retained == [0, len(prompts[4]) + len(firsts[2].token_ids) - 1]  # the first turn's slot went to the third
    finally:
        engine.stop()


def test_update_weights_then_matches_fresh_model(engine: ReferenceEngine, model_dir: Path, prompts) -> None:
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new_state = perturbed_state(fresh, seed=1)
    before = engine.generate(prompts[:2], GREEDY)
    pause_s = engine.update_weights(new_state.items(), version=3)
    # The decode loop was held while the weights were copied: a real, short pause, the one reported.
    assert 0 < pause_s < 30 and engine.stats()["last_update_pause_s"] == pause_s
    fresh.load_state_dict(new_state, strict=False)
    after = engine.generate(prompts, GREEDY)
    assert engine.version == 3
    for prompt, result in zip(prompts, after):
        assert result.token_ids == hf_greedy(fresh, prompt, GREEDY.max_new_tokens)
        assert set(result.token_versions) == {3}
    assert [r.token_ids for r in before] != [r.token_ids for r in after[:2]]


def test_update_refuses_bad_names_and_shapes_without_touching_weights(engine: ReferenceEngine, prompts) -> None:
    before = engine.generate([prompts[0]], GREEDY)[0].token_ids
    with pytest.raises(KeyError, match="no_such.weight"):
        engine.update_weights([("no_such.weight", torch.zeros(2))], version=1)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.update_weights([("model.embed_tokens.weight", torch.zeros_like(engine.tensor_by_name("model.embed_tokens.weight"))), ("model.norm.weight", torch.zeros(3))], version=1)
    assert engine.version == 0
    assert engine.generate([prompts[0]], GREEDY)[0].token_ids == before


def test_sequence_spanning_an_update_keeps_its_cache(engine: ReferenceEngine, model_dir: Path, prompts) -> None:
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new_state = perturbed_state(old, seed=2)
    new.load_state_dict(new_state, strict=False)
    prompt = prompts[1]
    future = engine.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=40))
    wait_for(lambda: engine.stats()["generated_tokens"] >= 6)
    engine.update_weights(new_state.items(), version=1)
    result = future.result(timeout=120)
    assert set(result.token_versions) == {0, 1}
    switch = result.token_versions.index(1)
    assert result.token_versions == [0] * switch + [1] * (len(result.token_ids) - switch)
    assert result.token_ids == continue_on_old_cache(old, new, prompt, result.token_ids, switch)
    # The update really changed the continuation.
    assert result.token_ids != hf_greedy(old, prompt, 40)


def test_request_admitted_after_an_update_does_not_reuse_stale_prompt_kv(model_dir: Path, prompts) -> None:
    """A sequence running across an update keeps its old-weights KV (PipelineRL's design), but a
    request admitted after the update with the same prompt must not copy that KV: its tokens are
    tagged with the new version, so they must be exactly what the new weights give."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new_state = perturbed_state(base, seed=4)
    prompt = prompts[1]
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=4))
    with engine:
        running = engine.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=400), request_id="running")
        wait_for(lambda: engine.stats()["generated_tokens"] >= 3)
        # The update as the weight receiver does it, and the new request queued while paused,
        # so the old-weights sequence is certainly still in the cache when it is admitted.
        with engine.paused():
            with torch.no_grad():
                for name, tensor in new_state.items():
                    engine.tensor_by_name(name).copy_(tensor)
            engine.set_version(1)
            assert not running.done()
            late = engine.submit(prompt, GREEDY)
        late_result = late.result(timeout=120)
        engine.abort("running")
        assert 1 in running.result(timeout=120).token_versions  # it did keep decoding across the update
    fresh_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fresh_model.load_state_dict(new_state, strict=False)
    with ReferenceEngine(fresh_model, config=EngineConfig(max_batch_size=4)) as fresh:
        expected = fresh.generate([prompt], GREEDY)[0]
    assert late_result.token_versions == [1] * len(late_result.token_ids)
    assert late_result.token_ids == expected.token_ids
    assert late_result.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_abort_running_and_waiting_requests(model_dir: Path, prompts) -> None:
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=1))
    with engine:
        running = engine.submit(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=500), request_id="long")
        waiting = engine.submit(prompts[1], GREEDY, request_id="queued")  # one slot: it must wait
        wait_for(lambda: engine.stats()["generated_tokens"] >= 3)
        assert engine.abort("queued")
        assert engine.abort("long")
        assert not engine.abort("never-submitted")
        partial = running.result(timeout=60)
        queued = waiting.result(timeout=60)
        assert partial.finish_reason == "abort" and 3 <= len(partial.token_ids) < 500
        assert len(partial.logprobs) == len(partial.token_versions) == len(partial.token_ids)
        assert queued.finish_reason == "abort" and queued.token_ids == []
        # The slot is free again and the engine keeps serving.
        again = engine.generate([prompts[2]], GREEDY)[0]
        assert again.finish_reason in ("stop", "length") and again.token_ids
        assert engine.stats()["requests_aborted"] == 2


def test_seeded_sampling_is_reproducible_and_logprobs_are_of_the_adjusted_distribution(
    engine: ReferenceEngine, hf_model, prompts
) -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1234)
    alone = engine.generate([prompts[3]], params)[0]
    # Same seed in a different batch -> same tokens; another seed -> different tokens.
    crowd = engine.generate([prompts[0], prompts[3], prompts[1]], params)
    other = engine.generate([prompts[3]], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=99))[0]
    assert crowd[1].token_ids == alone.token_ids
    assert other.token_ids != alone.token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompts[3] + alone.token_ids])).logits[0].float()
    for step, (token, logprob) in enumerate(zip(alone.token_ids, alone.logprobs)):
        probs = torch.softmax(logits[len(prompts[3]) - 1 + step] / 0.7, dim=-1)
        sorted_probs, order = probs.sort(descending=True)
        keep = (sorted_probs.cumsum(0) - sorted_probs) < 0.9
        kept = set(order[keep].tolist())
        assert token in kept
        assert logprob == pytest.approx(math.log(float(probs[token]) / float(sorted_probs[keep].sum())), abs=1e-4)


def test_stop_token_ids_and_length(engine: ReferenceEngine, prompts) -> None:
    reference = engine.generate([prompts[4]], GREEDY)[0].token_ids
    stop_token = reference[4]
    stopped = engine.generate([prompts[4]], SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=[stop_token]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == reference[: reference.index(stop_token) + 1]
    short = engine.generate([prompts[4]], SamplingParams(temperature=0.0, max_new_tokens=3))[0]
    assert short.finish_reason == "length" and short.token_ids == reference[:3]


def test_invalid_requests_are_refused_with_the_field_named(engine: ReferenceEngine) -> None:
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        engine.submit([], GREEDY)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.submit([1, 2], SamplingParams(max_new_tokens=0))
    with pytest.raises(ValueError, match="top_p"):
        engine.submit([1, 2], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([10**9], GREEDY)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.submit([1, 2], SamplingParams(max_new_tokens=10**6))


def test_an_empty_stop_text_is_refused(engine: ReferenceEngine, prompts) -> None:
    with pytest.raises(ValueError, match="empty stop text"):
        engine.submit(prompts[0], SamplingParams(stop=["```", ""]))
    assert engine.in_flight_ids() == []
