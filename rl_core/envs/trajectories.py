"""Multi-turn trajectories: generate → tool call? run it, append its output → generate again.

One trajectory is one training sample. Its completion is every turn's tokens in order: the model's
(sampled: their behaviour logprobs and policy versions, trained, mask 1) and the tool's (text the
environment wrote, tokenized here: logprob 0.0, version `TOOL_TOKEN_VERSION`, mask 0 — context the
policy reads, never trained). A turn after a tool call is a new request whose prompt is the
previous prompt + the model's tokens + the tool output's tokens, so the sample the trainer scores
is token for token what the engine saw; a weight update between (or inside) turns shows in the
per-token versions. The actor and the evaluator both run trajectories through `TrajectoryRunner`.

The budget: `sampling.max_new_tokens` bounds the whole completion (model and tool tokens alike),
so a trajectory never grows past the prompt + budget a single-turn sample may have: each
continuation asks for what is left, and a tool output is cut to leave the model one token.

A model turn that holds a tool call is cut where the call ends (`ToolCall.end`, to the first
token reaching it): what the model wrote after its code block (an imagined output) is dropped,
not trained. Requests carry the env's `stop_texts` (`SamplingParams.stop`: where a call may end),
so the engine stops a turn at its call instead of decoding an imagined output to the budget; a
stop that ends no call (the fence that opens a block) is continued as the same turn: a request for
the prompt + the turn so far, whose K/V the engine kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from rl_core.common.contracts import TOOL_TOKEN_VERSION, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from rl_core.envs.environments import Environment

# Sends one continuation: (prompt token ids, sampling with the budget left) → one result.
ContinueFn = Callable[[list[int], SamplingParams], Awaitable[GenerationResult]]


class TokenCodec(Protocol):
    """Text ↔ token ids as the policy's tokenizer does it (`HFTokenCodec`)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class HFTokenCodec:
    """An HF tokenizer as a `TokenCodec`: no special tokens added (a tool turn continues the
    sequence), special tokens left out of the text (the env parses what the model wrote)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str) -> HFTokenCodec:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))


@dataclass(frozen=True)
class ToolSpans:
    """Seconds of one metrics window: `busy_s` with at least one tool call running (calls overlap,
    so their summed seconds would count one span several times), `waiting_s` the part of it with no
    generation request of the actor in flight: its servers have nothing of it to decode, so the
    rollout waits on the tool. While a call runs beside decoding of other samples it only costs CPU."""

    busy_s: float
    waiting_s: float


class ToolClock:
    """Counts the tool calls running (`start`/`stop`, the trajectory runner) and the actor's
    generation requests in flight (`generation_started`/`_finished`, every request the actor
    sends), and adds up `ToolSpans` between two `take`s."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.running = 0
        self.generating = 0
        self._busy_s = 0.0
        self._waiting_s = 0.0
        self._now = now
        self._since = now()

    def _advance(self) -> None:
        now = self._now()
        if self.running:
            self._busy_s += now - self._since
            if not self.generating:
                self._waiting_s += now - self._since
        self._since = now

    def start(self) -> None:
        self._advance()
        self.running += 1

    def stop(self) -> None:
        self._advance()
        self.running -= 1

    def generation_started(self) -> None:
        self._advance()
        self.generating += 1

    def generation_finished(self) -> None:
        self._advance()
        self.generating -= 1

    def take(self) -> ToolSpans:
        """The spans since the last `take` (calls still running count up to now)."""
        self._advance()
        spans = ToolSpans(self._busy_s, self._waiting_s)
        self._busy_s = self._waiting_s = 0.0
        return spans


@dataclass
class Trajectory:
    """One finished trajectory: the stream's `RolloutSample` fields and `metadata["turns"]`."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    model_texts: list[str] = field(default_factory=list)
    finish_reason: str = "stop"
    tool_calls: int = 0
    tool_statuses: list[str] = field(default_factory=list)
    tool_seconds: list[float] = field(default_factory=list)
    continued_prompt_tokens: int = 0  # prompt tokens of the continuation requests

    @property
    def model_text(self) -> str:
        """What the model wrote, every turn joined: what the answer is looked for in."""
        return "".join(self.model_texts)

    @property
    def num_versions(self) -> int:
        return len({v for v in self.token_versions if v != TOOL_TOKEN_VERSION})

    def add_model_turn(self, token_ids: list[int], logprobs: list[float], versions: list[int], text: str) -> None:
        start = len(self.token_ids)
        self.token_ids += token_ids
        self.logprobs += logprobs
        self.token_versions += versions
        self.mask += [1] * len(token_ids)
        self.model_texts.append(text)
        self.turns.append({"kind": "model", "start": start, "end": len(self.token_ids)})

    def add_tool_turn(self, token_ids: list[int], status: str, seconds: float) -> None:
        start = len(self.token_ids)
        self.token_ids += token_ids
        self.logprobs += [0.0] * len(token_ids)
        self.token_versions += [TOOL_TOKEN_VERSION] * len(token_ids)
        self.mask += [0] * len(token_ids)
        self.tool_calls += 1
        self.tool_statuses.append(status)
        self.tool_seconds.append(seconds)
        self.turns.append({"kind": "tool", "start": start, "end": len(self.token_ids), "status": status,
                           "seconds": round(seconds, 4)})

    def metadata(self, env_name: str) -> dict[str, Any]:
        """The stream's `metadata` entries of a trajectory (the platform's rollout viewer reads them)."""
        return {"turns": [dict(turn) for turn in self.turns], "tool_calls": self.tool_calls, "env": env_name}


def tokens_through(token_ids: list[int], end: int, decode: Callable[[list[int]], str]) -> int:
    """The fewest leading tokens whose text reaches character `end` (binary search: a longer
    prefix never decodes to shorter text)."""
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if len(decode(token_ids[:middle])) >= end:
            high = middle
        else:
            low = middle + 1
    return high


class TrajectoryRunner:
    """Runs trajectories of one environment: `complete` continues a first model turn (already
    generated, e.g. one of a group's n) to its end. Tool calls await the environment's async
    sandbox, so other trajectories keep decoding meanwhile; `clock` collects the wait."""

    def __init__(self, env: Environment, codec: TokenCodec, clock: ToolClock | None = None) -> None:
        self.env = env
        self.codec = codec
        self.clock = clock or ToolClock()

    async def complete(self, first: GenerationResult, generate: ContinueFn, sampling: SamplingParams) -> Trajectory:
        env, codec = self.env, self.codec
        trajectory = Trajectory(prompt_token_ids=list(first.prompt_token_ids))
        budget = sampling.max_new_tokens
        result = first
        ids: list[int] = []  # the model turn so far (a stop that ended no call splits it in requests)
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            ids, logprobs, versions = ids + list(result.token_ids), logprobs + list(result.logprobs), versions + list(result.token_versions)
            text = codec.decode(ids)
            call = env.on_model_turn(text, trajectory.tool_calls) if result.finish_reason != "abort" else None
            room = budget - len(trajectory.token_ids) - len(ids)
            if call is None and result.stop_reason in env.stop_texts(trajectory.tool_calls) and room > 0:
                # Stopped where a call may end, but none did (the fence that opens a block): the turn goes on.
                result = await self._continue(trajectory, ids, generate, sampling, room)
                continue
            keep = len(ids) if call is None else tokens_through(ids, call.end, codec.decode)
            if keep < len(ids):
                text = codec.decode(ids[:keep])
            trajectory.add_model_turn(ids[:keep], logprobs[:keep], versions[:keep], text)
            ids, logprobs, versions = [], [], []
            if call is None:
                trajectory.finish_reason = result.finish_reason
                return trajectory
            room = budget - len(trajectory.token_ids)
            if room <= 1:  # no room for the tool's output and an answer after it
                trajectory.finish_reason = "length"
                return trajectory
            self.clock.start()
            try:
                outcome = await env.run_tool(call)
            finally:
                self.clock.stop()
            output = codec.encode(env.tool_output_text(call, outcome))[: room - 1]
            trajectory.add_tool_turn(output, outcome.status, float(outcome.seconds))
            result = await self._continue(trajectory, [], generate, sampling, budget - len(trajectory.token_ids))

    async def _continue(self, trajectory: Trajectory, turn_ids: list[int], generate: ContinueFn, sampling: SamplingParams,
                        room: int) -> GenerationResult:
        """The next request of a trajectory: its prompt + every token so far + `turn_ids` (the model
        turn under way, if a stop ended no call), for the `room` tokens left of its budget."""
        prompt = trajectory.prompt_token_ids + trajectory.token_ids + turn_ids
        trajectory.continued_prompt_tokens += len(prompt)
        # A seeded request (an evaluation) gets a seed of its own per continuation: the same seed
        # again would draw the k samples' continuations from one stream of random numbers.
        seed = None if sampling.seed is None else (sampling.seed + len(prompt)) & 0xFFFFFFFF
        return await generate(prompt, replace(sampling, max_new_tokens=room, stop_token_ids=list(sampling.stop_token_ids),
                                              stop=self.env.stop_texts(trajectory.tool_calls), seed=seed))
