"""The reference inference engine: pure torch + transformers, CPU or CUDA.

One background thread runs the decode loop. Between two steps it applies
aborts, honours pause requests (weight updates), and admits waiting requests
into free KV-cache slots; a step then prefills the newly admitted prompts and
advances every running sequence by one token (or by an accepted speculative
draft plus one). Requests therefore join and leave the running batch at step
boundaries — continuous batching — and a weight update never lands inside a
forward pass, so sequences in flight simply continue on the new weights with
their KV caches intact (PipelineRL's in-flight update: those K/V stay as the old
weights computed them). Each token records the engine `version` of the step
that sampled it. A request admitted after an update never copies a prompt's K/V
computed at an older version (`split_shared_prompts`, `split_shared_prefixes`):
every token it yields is the new weights' own. A finished sequence's K/V stay cached for a while
(`RetainedPrefixes`, same version rule), so a tool call's next turn prefills only the tool's output.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from rl_core.common.contracts import GenerationResult, SamplingParams
from rl_core.kernels.cpu import use_onednn_linear
from rl_core.config.engine import ENGINE_COUNTERS, Drafter, EngineConfig
from rl_core.inference.sampling import PositionUniforms, check_request, completed_stop_text, eos_token_ids, sample_rows, verify_drafts, width_groups
from rl_core.inference.kv_cache import ENGINE_ATTENTION, SlotKVCache, register_engine_attention, split_shared_prefixes, split_shared_prompts
from rl_core.inference.kv_cache import RetainedPrefix, RetainedPrefixes
from rl_core.inference.kv_cache import compact_slots, followers_first  # which slot each running sequence holds
from rl_core.models.model_io import model_dtype, synchronize_device, use_tf32_matmul  # the device wait before an update's clock stops
from rl_core.inference.shared_decode import extended_history_hash, prompt_history_hash, representatives
from rl_core.inference.speculation import DraftLengthController
from rl_core.rundir.timeline import ServerTimeline

log = logging.getLogger(__name__)


@dataclass
class _Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    history_key: str | None
    future: Future
    uniforms: PositionUniforms
    stop_ids: frozenset[int]
    draft_length: DraftLengthController
    slot: int = -1
    cache_len: int = 0  # tokens whose K/V are in the cache; the last generated token is not yet
    prompt_kv_version: int = -1  # weight version the prompt's K/V were computed at (set at admission)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    admitted_step: int = -1  # engine step of admission: with the history, what decides shared decode rows
    history_hash: int = 0  # of prompt + tokens so far (shared_decode.py)
    abort_requested: bool = False
    finish_reason: str | None = None
    stop_reason: str | None = None  # the stop text that ended it (SamplingParams.stop)


@dataclass
class PauseHandle:
    """Yielded by `ReferenceEngine.paused()`; `pause_s` is filled in on exit."""

    started: float
    pause_s: float = 0.0


class ReferenceEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any | None = None,
        config: EngineConfig | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.model = model.eval()
        use_onednn_linear(model)  # CPU only: ~2x faster GEMMs than torch's default (cpu_kernels.py)
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        budget = self.config.spec_step_token_budget  # None: by device (EngineConfig says why)
        self.draft_token_budget = budget if budget is not None else (self.config.forward_overhead_tokens if self.device.type == "cpu" else 0)
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = int(text_config.vocab_size)
        max_positions = int(getattr(text_config, "max_position_embeddings", 4096) or 4096)
        self.max_seq_len = int(self.config.max_seq_len or min(max_positions, 4096))
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        batch, retained = self.config.max_batch_size, self.config.retained_sequences
        self.cache = SlotKVCache(
            num_layers=text_config.num_hidden_layers,
            num_slots=batch + retained,  # the running sequences' slots first, then the finished ones kept
            num_kv_heads=getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
            initial_capacity=self.config.initial_cache_len,
            max_capacity=self.max_seq_len,
        )
        # sdpa takes a boolean "may attend" mask; eager attention adds a float mask.
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        if attention == "sdpa":
            register_engine_attention()
            model.set_attn_implementation(ENGINE_ATTENTION)
            attention = ENGINE_ATTENTION
        self._bool_mask = attention in ("sdpa", ENGINE_ATTENTION)
        self.default_stop_ids = frozenset(eos_token_ids(model, tokenizer))
        # Tied weights (lm_head = embed_tokens) appear under both names here, so
        # either name from a trainer lands on the same storage.
        self._tensors_by_name: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=True))

        self.version = 0
        self._cond = threading.Condition()
        self._update_lock = threading.Lock()
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_slots = list(range(batch))
        self._retained = RetainedPrefixes(range(batch, batch + retained))
        self._pause_requests = 0
        self._paused_ack = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seed_counter = 0
        self._rows_this_step = 0
        self.counters: dict[str, float] = dict.fromkeys(ENGINE_COUNTERS, 0)
        self.timeline: ServerTimeline | None = None  # a run's server records its decode spans and pauses

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        config: EngineConfig | None = None,
        drafter: Drafter | None = None,
    ) -> ReferenceEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"model directory {model_dir} has no config.json (not an HF model dir)")
        use_tf32_matmul(device)  # a float32 model on an Ampere+ GPU: tensor-core matmuls
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(dtype), attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        return cls(model.to(device), tokenizer, config=config, drafter=drafter)

    # ------------------------------------------------------------------ API

    def start(self) -> ReferenceEngine:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stopping = False
            self._thread = threading.Thread(target=self._run_loop, name="inflight-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop; every unfinished request resolves with finish_reason "abort"."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            leftovers = self._waiting + self._running
            self._waiting, self._running = [], []
            finished = [self._finish_locked(seq, "abort") for seq in leftovers]
        self._resolve(finished)

    def __enter__(self) -> ReferenceEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        history_key: str | None = None,
    ) -> Future[GenerationResult]:
        prompt = [int(token) for token in prompt_token_ids]
        check_request(prompt, params, self.vocab_size, self.max_seq_len)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop: stop texts need the engine's tokenizer (this engine was built without one)")
        request_id = request_id or uuid.uuid4().hex
        with self._cond:
            if self._stopping or self._thread is None:
                raise RuntimeError("engine is not running: call start() first")
            if request_id in self._by_id:
                raise ValueError(f"request_id {request_id!r} is already in flight")
            if params.seed is None:
                # No seed: still reproducible per engine seed and submission order.
                seed = hash((self.config.seed, self._seed_counter)) & 0xFFFFFFFF
                self._seed_counter += 1
            else:
                seed = int(params.seed)
            seq = _Sequence(
                request_id=request_id,
                prompt_token_ids=prompt,
                params=params,
                history_key=history_key,
                future=Future(),
                uniforms=PositionUniforms(seed),
                stop_ids=self.default_stop_ids | frozenset(int(t) for t in params.stop_token_ids),
                draft_length=DraftLengthController(self.config.initial_draft_len, self.config.max_draft_len),
                history_hash=prompt_history_hash(prompt),
            )
            seq.future.set_running_or_notify_cancel()
            # Behind every waiting request of the same or a lower priority value: FIFO per priority.
            position = len(self._waiting)
            while position and self._waiting[position - 1].params.priority > params.priority:
                position -= 1
            self._waiting.insert(position, seq)
            self._by_id[request_id] = seq
            self.counters["requests_submitted"] += 1
            self._cond.notify_all()
        return seq.future

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, timeout: float | None = None
    ) -> list[GenerationResult]:
        futures = [self.submit(prompt, params) for prompt in prompts]
        return [future.result(timeout=timeout) for future in futures]

    def abort(self, request_id: str) -> bool:
        """Finish a request early with finish_reason "abort" (its future gets the partial
        result). Returns False if no such request is in flight."""
        finished = []
        with self._cond:
            seq = self._by_id.get(request_id)
            if seq is None:
                return False
            if seq in self._waiting:
                self._waiting.remove(seq)
                finished.append(self._finish_locked(seq, "abort"))
            else:
                seq.abort_requested = True  # the loop finishes it at the next step boundary
                self._cond.notify_all()
        self._resolve(finished)
        return True

    def in_flight_ids(self) -> list[str]:
        with self._cond:
            return list(self._by_id)

    @contextmanager
    def paused(self) -> Iterator[PauseHandle]:
        """Hold the decode loop at a step boundary for the duration of the block.

        Nothing runs a forward pass while the block runs, so weights can be
        swapped in place; KV caches and sequences stay as they are."""
        with self._update_lock:
            with self._cond:
                self._pause_requests += 1
                self._cond.notify_all()
                while self._thread is not None and self._thread.is_alive() and not self._paused_ack:
                    self._cond.wait(timeout=0.5)
            handle = PauseHandle(started=time.perf_counter())
            wall_start = time.time()
            try:
                yield handle
            finally:
                # The block's device work (an NCCL receive, a device copy) is queued, not done,
                # when it returns: the decode loop resumes, and the clock stops, once it is done.
                synchronize_device(self.device)
                handle.pause_s = time.perf_counter() - handle.started
                if self.timeline is not None:  # the block set the version it installed
                    self.timeline.pause(wall_start, wall_start + handle.pause_s, self.version)
                with self._cond:
                    self._pause_requests -= 1
                    self._cond.notify_all()

    def tensor_by_name(self, name: str) -> torch.Tensor:
        try:
            return self._tensors_by_name[name]
        except KeyError:
            raise KeyError(f"model has no parameter or buffer named {name!r}") from None

    def check_update(self, specs: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        """Refuse an update before anything is touched: every name must exist with that shape."""
        for name, shape in specs:
            target = self.tensor_by_name(name)
            if tuple(target.shape) != tuple(shape):
                raise ValueError(f"parameter {name!r}: shape {tuple(shape)} does not match the model's {tuple(target.shape)}")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Copy new weights in place between two decode steps; returns the pause in seconds."""
        items = list(named_tensors)
        self.check_update((name, tuple(tensor.shape)) for name, tensor in items)
        with self.paused() as pause:
            with torch.no_grad():
                for name, tensor in items:
                    self._tensors_by_name[name].copy_(tensor)
            self.set_version(version)
        return self.record_update(pause.pause_s)

    def set_version(self, version: int) -> None:
        self.version = int(version)

    def record_update(self, pause_s: float) -> float:
        self.counters["weight_updates"] += 1
        self.counters["last_update_pause_s"] = pause_s
        return pause_s

    def stats(self) -> dict[str, float]:
        with self._cond:
            return {
                "version": self.version,
                "running": len(self._running),
                "waiting": len(self._waiting),
                "kv_cache_capacity": self.cache.capacity,
                **self.counters,
            }

    # ------------------------------------------------------------- the loop

    def _run_loop(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never leave callers waiting on a dead loop
            log.exception("engine loop crashed")
            with self._cond:
                self._stopping = True
                leftovers = self._waiting + self._running
                self._waiting, self._running = [], []
                for seq in leftovers:
                    self._finish_locked(seq, "error")
                    if not seq.future.done():
                        seq.future.set_exception(RuntimeError(f"engine loop crashed: {exc!r}"))
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            finished: list[tuple[_Sequence, GenerationResult]] = []
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    if self._pause_requests:
                        self._paused_ack = True
                        self._cond.notify_all()
                        while self._pause_requests and not self._stopping:
                            self._cond.wait()
                        self._paused_ack = False
                        continue
                    for seq in [s for s in self._running if s.abort_requested]:
                        finished.append(self._finish_locked(seq, "abort"))
                    if self._waiting or self._running:
                        break
                    self._resolve(finished)  # nothing to run: hand out aborted results before sleeping
                    finished = []
                    if self.timeline is not None:
                        self.timeline.idle()  # the busy span ends here, not at the next request
                    self._cond.wait()
                compact_slots(self._running, self._free_slots, self.cache)
                # In slot order: the running sequences hold slots 0..n-1, so the cache hands the
                # layers a view of one slot range instead of gathering a copy per layer and step.
                decoding = sorted(self._running, key=lambda seq: seq.slot)
                admitted = self._admit_locked()
            self._resolve(finished)
            version = self.version  # weights cannot change until the step is over
            step_started = time.time()
            self._rows_this_step = len(admitted) + len(decoding)  # the step's draft budget is shared by all of them
            try:
                with torch.inference_mode():
                    leaders, followers = split_shared_prompts(admitted, decoding, version)
                    if followers:
                        with self._cond:
                            followers_first(leaders, [follower for follower, _ in followers])
                    kept: list[_Sequence | RetainedPrefix] = [*decoding, *(self._retained.current(version) if leaders else [])]
                    pioneers, dependents = split_shared_prefixes(leaders, kept, version)
                    if pioneers:
                        self._prefill(pioneers, version)
                    if dependents:  # the start of their prompt (system prompt, template, a finished turn) is cached: the rest
                        for seq, source, length in dependents:
                            self._share_prompt(source, seq, length)
                            if isinstance(source, RetainedPrefix):
                                self._retained.used(source)
                                self.counters["prompt_tokens_retained"] += length
                        self._prefill([seq for seq, _, _ in dependents], version)
                    for follower, source in followers:
                        # Same prompt as a sequence already in the cache: copy its prompt K/V
                        # and let the follower feed only its last prompt token this step.
                        self._share_prompt(source, follower, len(follower.prompt_token_ids) - 1)
                    if decoding or followers:
                        self._decode(decoding + [follower for follower, _ in followers], version)
            except Exception as exc:  # a failed step fails its requests, not the server
                log.exception("engine step failed")
                failed = []
                with self._cond:
                    for seq in admitted + decoding:
                        if seq.slot < 0:
                            continue  # already finished and handed out
                        if seq.finish_reason is None:
                            self._finish_locked(seq, "error")
                            seq.future.set_exception(RuntimeError(f"engine step failed: {exc!r}"))
                        else:
                            failed.append(self._finish_locked(seq, seq.finish_reason))
                self._resolve(failed)
                continue
            if self.timeline is not None:
                self.timeline.step(step_started, time.time(), len(admitted) + len(decoding))
            with self._cond:
                self.counters["steps"] += 1
                done = [seq for seq in admitted + decoding if seq.finish_reason is not None]
                self._retained.keep_finished(self.cache, done, version)
                finished = [self._finish_locked(seq, seq.finish_reason) for seq in done]
            self._resolve(finished)

    def _admit_locked(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        budget = self.config.max_prefill_tokens
        while self._waiting and self._free_slots:
            seq = self._waiting[0]
            if admitted and len(seq.prompt_token_ids) > budget:
                break
            self._waiting.pop(0)
            self._free_slots.sort()
            seq.slot = self._free_slots.pop(0)
            seq.admitted_step = int(self.counters["steps"])
            budget -= len(seq.prompt_token_ids)
            self._running.append(seq)
            admitted.append(seq)
        return admitted

    def _finish_locked(self, seq: _Sequence, reason: str) -> tuple[_Sequence, GenerationResult]:
        seq.finish_reason = reason
        if seq in self._running:
            self._running.remove(seq)
        if seq.slot >= 0:
            self._free_slots.append(seq.slot)
            seq.slot = -1
        self._by_id.pop(seq.request_id, None)
        self.counters["requests_finished"] += 1
        if reason == "abort":
            self.counters["requests_aborted"] += 1
        result = GenerationResult(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(seq.token_ids),
            logprobs=list(seq.logprobs),
            token_versions=list(seq.token_versions),
            finish_reason=reason,
            stop_reason=seq.stop_reason,
        )
        return seq, result

    def _resolve(self, finished: list[tuple[_Sequence, GenerationResult]]) -> None:
        # Outside the lock: future callbacks (the server's asyncio bridge) may run here.
        for seq, result in finished:
            if self.tokenizer is not None:
                try:
                    result.text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                except Exception:  # ids beyond the tokenizer's vocabulary: keep the ids, no text
                    log.exception("cannot decode %s", seq.request_id)
            if self.drafter is not None and seq.history_key is not None and result.finish_reason in ("stop", "length"):
                try:
                    self.drafter.add_response(seq.history_key, list(result.token_ids))
                except Exception:
                    log.exception("drafter.add_response failed for %s", seq.history_key)
            if not seq.future.done():
                seq.future.set_result(result)

    # ------------------------------------------------------------- one step

    def _forward(self, seqs: list[_Sequence], queries: list[list[int]], keep: int) -> torch.Tensor:
        """Run `queries[b]` (tokens at positions `seqs[b].cache_len ...`) through the model.

        Queries are left-padded to a common length so the last `keep`
        columns hold every row's last tokens; returns float logits `[B, keep, V]`."""
        input_ids, positions, mask = self.cache.batch_inputs(
            [seq.slot for seq in seqs], [seq.cache_len for seq in seqs], queries, None if self._bool_mask else self.dtype
        )
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        return output.logits.float()

    def _share_prompt(self, source: _Sequence | RetainedPrefix, target: _Sequence, length: int) -> None:
        self.cache.copy_prefix(source.slot, target.slot, length)
        target.cache_len = length
        self.counters["prompt_tokens_shared"] += length

    def _prefill(self, seqs: list[_Sequence], version: int) -> None:
        for seq in seqs:
            self.counters["prompt_tokens"] += len(seq.prompt_token_ids)
        self._advance(seqs, [seq.prompt_token_ids[seq.cache_len :] for seq in seqs], version)

    def _decode(self, seqs: list[_Sequence], version: int) -> None:
        # A follower of a shared prompt has no token yet: its pending token is the prompt's last.
        self._advance(seqs, [[seq.token_ids[-1]] if seq.token_ids else [seq.prompt_token_ids[-1]] for seq in seqs], version)

    def _advance(self, seqs: list[_Sequence], prefixes: list[list[int]], version: int) -> None:
        """Feed each sequence its tokens not yet in the cache (`prefixes`: the prompt at
        prefill, the last sampled token afterwards), plus a draft where the drafter has
        one, and append the token(s) the target model yields. Rows are left-padded to a
        common width per forward, so rows of very different widths (one-token decodes next
        to 17-token verifies) run in separate forwards, grouped by `width_groups`."""
        drafts = self._drafts(seqs, prefixes)
        if self.config.share_identical_decodes and all(len(prefix) == 1 and not draft for prefix, draft in zip(prefixes, drafts)):
            stand_ins = representatives(seqs)
            if any(stand_in != row for row, stand_in in enumerate(stand_ins)):
                self._decode_shared(seqs, prefixes, stand_ins, version)
                return
        queries = [prefix + draft for prefix, draft in zip(prefixes, drafts)]
        for rows in width_groups([len(query) for query in queries], self.config.forward_overhead_tokens):
            group = [seqs[row] for row in rows]
            group_drafts = [drafts[row] for row in rows]
            keep = max(len(draft) for draft in group_drafts) + 1
            logits = self._forward(group, [queries[row] for row in rows], keep=keep)
            for seq, row in zip(group, rows):
                seq.cache_len += len(prefixes[row])
            plain = [index for index, draft in enumerate(group_drafts) if not draft]
            if plain:
                plain_logits = logits[:, -1] if len(plain) == len(rows) else logits[plain, -1]
                self._sample_and_append([group[index] for index in plain], plain_logits, version)
            speculating = [index for index, draft in enumerate(group_drafts) if draft]
            if speculating:
                self._verify_and_append(
                    [group[index] for index in speculating], [group_drafts[index] for index in speculating],
                    logits[speculating] if len(speculating) < len(rows) else logits, version,
                )

    def _decode_shared(self, seqs: list[_Sequence], prefixes: list[list[int]], stand_ins: list[int], version: int) -> None:
        """One decode step where `seqs[row]` takes the logits of `seqs[stand_ins[row]]` (the same
        history): a forward over the stand-ins, their new K/V position copied to the rest."""
        computed = sorted(set(stand_ins))
        logits_row = {row: number for number, row in enumerate(computed)}
        logits = self._forward([seqs[row] for row in computed], [prefixes[row] for row in computed], keep=1)
        sharing = [row for row, stand_in in enumerate(stand_ins) if stand_in != row]
        self.cache.copy_positions([seqs[stand_ins[row]].slot for row in sharing], [seqs[row].slot for row in sharing],
                                  [seqs[row].cache_len for row in sharing])
        for seq in seqs:
            seq.cache_len += 1
        self.counters["decode_rows_shared"] += len(sharing)
        rows = torch.tensor([logits_row[stand_in] for stand_in in stand_ins], dtype=torch.long, device=logits.device)
        self._sample_and_append(seqs, logits[:, -1].index_select(0, rows), version)

    def _verify_and_append(self, seqs: list[_Sequence], drafts: list[list[int]], logits: torch.Tensor, version: int) -> None:
        """Check each row's draft against the target (`logits[b, -len(draft)-1:]` are the
        distributions after the prefix and after each draft token) and append what it yields."""
        uniforms = [
            seq.uniforms.span(len(seq.token_ids), len(draft) + 1) if seq.params.temperature > 0 else []
            for seq, draft in zip(seqs, drafts)
        ]
        outcomes = verify_drafts(
            logits, drafts, [seq.params.temperature for seq in seqs], [seq.params.top_p for seq in seqs], uniforms
        )
        for seq, draft, (tokens, logprobs, accepted) in zip(seqs, drafts, outcomes):
            self.counters["spec_drafted_tokens"] += len(draft)
            self.counters["spec_accepted_tokens"] += accepted
            self.counters["spec_verify_steps"] += 1
            seq.draft_length.update(len(draft), accepted)
            # The cache now validly holds the prefix and the accepted draft prefix;
            # entries of rejected draft tokens get overwritten before anyone reads them.
            seq.cache_len += accepted
            for token, logprob in zip(tokens, logprobs):
                if self._append(seq, token, logprob, version):
                    break

    def _drafts(self, seqs: list[_Sequence], prefixes: list[list[int]]) -> list[list[int]]:
        drafts: list[list[int]] = []
        # The step's draft-token budget, shared evenly: on a compute-bound device a verified
        # token costs as much as a decoded one, so a full batch gets short drafts and a
        # draining batch (the long tail of a round) long ones.
        budget = self.draft_token_budget
        per_row = max(self.config.max_draft_len if budget <= 0 else budget // max(self._rows_this_step, len(seqs), 1), 0)
        for seq, prefix in zip(seqs, prefixes):
            draft: list[int] = []
            if self.drafter is not None and seq.history_key is not None:
                # Room for the draft plus the token the target adds after it.
                room = min(
                    seq.draft_length.length,
                    per_row,
                    seq.params.max_new_tokens - len(seq.token_ids) - 1,
                    self.max_seq_len - (seq.cache_len + len(prefix)) - 1,
                )
                if room > 0:
                    proposed = self.drafter.draft(seq.history_key, list(seq.token_ids), room)
                    draft = [int(token) for token in proposed[:room]]
                    if any(not 0 <= token < self.vocab_size for token in draft):
                        raise ValueError(f"drafter proposed token ids outside [0, {self.vocab_size}): {draft}")
            drafts.append(draft)
        return drafts

    def _sample_and_append(self, seqs: list[_Sequence], logits: torch.Tensor, version: int) -> None:
        temperatures = [seq.params.temperature for seq in seqs]
        uniforms = [seq.uniforms.at(len(seq.token_ids)) if seq.params.temperature > 0 else 0.0 for seq in seqs]
        tokens, logprobs = sample_rows(logits, temperatures, [seq.params.top_p for seq in seqs], uniforms)
        for seq, token, logprob in zip(seqs, tokens, logprobs):
            self._append(seq, token, logprob, version)

    def _append(self, seq: _Sequence, token: int, logprob: float, version: int) -> bool:
        """Record one sampled token; returns True when the sequence is finished."""
        seq.token_ids.append(token)
        seq.history_hash = extended_history_hash(seq.history_hash, token)
        seq.logprobs.append(logprob)
        seq.token_versions.append(version)
        self.counters["generated_tokens"] += 1
        if token in seq.stop_ids:
            seq.finish_reason = "stop"
        elif seq.params.stop and (text := completed_stop_text(self._decode_all, seq.token_ids, seq.params.stop)) is not None:
            seq.finish_reason, seq.stop_reason = "stop", text
        elif len(seq.token_ids) >= seq.params.max_new_tokens or seq.cache_len + 1 >= self.max_seq_len:
            seq.finish_reason = "length"
        return seq.finish_reason is not None

    def _decode_all(self, token_ids: list[int]) -> str:
        """Text of generated tokens, special ones included (what a stop text is searched in)."""
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))
