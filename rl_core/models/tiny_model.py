"""`python -m rl_core bootstrap-tiny DIR`: the tiny demo policy, built offline.

There is no model hub here, so the demo model is made from scratch:

1. a byte-level BPE tokenizer (digits always single tokens, so arithmetic is
   digit by digit) trained on a fixed built-in corpus, saved as an HF
   `PreTrainedTokenizerFast` with a ChatML chat template, `<|im_end|>` as EOS;
2. a Qwen2-architecture causal LM (head_dim 64, as vLLM's CPU backend needs),
   randomly initialised from the seed;
3. a seeded supervised warm start on the synthetic arithmetic task whose
   corpus mixes two kinds of answer, like a base model that sometimes reasons
   and sometimes blurts: worked solutions in columns (`rl_core.envs.problems.column_step`,
   one-digit facts that transfer to held-out problems) and quick guesses
   (`\\boxed{}` at once, within 3 of the answer, right about 1 time in 7). The
   model learns both and picks a guess most of the time, so it starts near
   35-45% held-out success at temperature 1.0 while working out problems
   would score ~80%: the headroom RL has to find, by learning from reward
   alone that working a problem out pays (response length rises as it does).
   Fixed step count and learning rate, so the recipe (and its time: a few
   minutes with 2 threads) does not depend on the machine.

Everything is seeded; `bootstrap.json` records the recipe and the measured
held-out success rate.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, SamplingConfig, TaskConfig
from rl_core.envs.problems import MATH_SYSTEM_PROMPT, Problem, _space_size, build_messages, load_task, synthetic_problems

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class TinyModelSpec:
    """Architecture of the tiny policy (Qwen2). head_dim = hidden_size / num_attention_heads = 64."""

    vocab_size: int = 1024  # tokenizer target; the embedding is padded to a multiple of 64
    hidden_size: int = 256
    intermediate_size: int = 1024
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024


@dataclass
class WarmStartSpec:
    """The supervised warm start: a fixed number of AdamW steps on the mixed corpus."""

    max_steps: int = 800  # ~80% worked-solution success by then (lr 1e-3); 3e-3 learnt 5x slower
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 30
    guess_share: float = 0.6  # fraction of targets that are a quick guess instead of a worked solution
    guess_spread: int = 3  # a guess is the answer plus a uniform offset in [-spread, spread]
    check_every: int = 200  # steps between validation checks (logged in bootstrap.json)
    validation_problems: int = 64
    eval_samples_per_problem: int = 4  # samples per held-out problem when measuring success
    eval_problems: int = 64  # held-out problems measured (the default task holds out 64)


# ---------------------------------------------------------------------------
# 1. Tokenizer
# ---------------------------------------------------------------------------

_CORPUS_WORDS = (
    "system user assistant Solve the problem Put final answer in Compute Please reason step by and put your "
    "within What is of a an to for if then so we have that let find number value sum product difference total "
    "each how many much are be can with from this which where when there + - * / = ( ) [ ] { } ^ _ , . : ; ? ! $ "
    "\\boxed \\frac \\dfrac \\sqrt \\pi \\cdot \\times \\left \\right \\le \\ge \\neq \\text \\theta \\infty "
    "x y z n k a b c m r"
)


def _tokenizer_corpus(seed: int) -> list[str]:
    """Fixed text the BPE merges are learnt from: chat framing, prompts, arithmetic, common LaTeX."""
    config = TaskConfig(seed=seed, num_terms=3, operators=["+", "-", "*"])
    task = load_task(config.model_copy(update={"train_size": 400}))
    lines = [_CORPUS_WORDS] * 20
    for prompt in (TaskConfig().system_prompt, MATH_SYSTEM_PROMPT):
        lines.extend([f"{IM_START}system\n{prompt}{IM_END}\n{IM_START}user\n"] * 50)
    lines.extend([f"{IM_START}assistant\n"] * 50)
    for problem in task.train:
        lines.append(problem.problem)
        lines.append(problem.solution or "")
    return lines


def build_tokenizer(seed: int = 0, vocab_size: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Digits split one per token, then byte-level: any text (MATH LaTeX included) encodes losslessly.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"  # generation batches pad on the left
    fast.model_max_length = TinyModelSpec.max_position_embeddings
    return fast


# ---------------------------------------------------------------------------
# 2. Model
# ---------------------------------------------------------------------------


def build_model(tokenizer, spec: TinyModelSpec, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    padded_vocab = int(math.ceil(len(tokenizer) / 64) * 64)
    config = Qwen2Config(
        vocab_size=padded_vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(IM_START),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model


# ---------------------------------------------------------------------------
# 3. Warm start
# ---------------------------------------------------------------------------


def warm_start_target(problem: Problem, rng: random.Random, spec: WarmStartSpec) -> str:
    """The response the warm start imitates for `problem`: a worked solution, or (with
    probability `spec.guess_share`) a quick guess, `\\boxed{}` at once with an answer
    off by up to `spec.guess_spread` (0 included)."""
    if rng.random() >= spec.guess_share:
        return problem.solution or f"\\boxed{{{problem.answer}}}"
    guess = int(problem.answer) + rng.randint(-spec.guess_spread, spec.guess_spread)
    return f"\\boxed{{{guess}}}"


def is_quick_guess(response: str) -> bool:
    """Whether a response is the guess kind (no worked step before the box)."""
    return response.lstrip().startswith("\\boxed")


def _encode_example(tokenizer, problem: Problem, response: str, system_prompt: str) -> tuple[list[int], list[int]]:
    prompt_ids = tokenizer.apply_chat_template(
        build_messages(problem, system_prompt), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    response_ids = tokenizer.encode(response + IM_END, add_special_tokens=False)
    labels = [-100] * len(prompt_ids) + response_ids
    return list(prompt_ids) + response_ids, labels


def _batch_loss(model, encoded: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean next-token loss on the response tokens of a batch of chat examples.

    Every example starts with the same chat framing + system prompt (about half of
    its tokens), so that shared prefix runs once and its KV cache is repeated over
    the batch: the same loss and gradients as the plain forward, at ~55% of the compute."""
    prefix = 0
    first = encoded[0][0]
    while all(len(ids) > prefix + 1 and ids[prefix] == first[prefix] for ids, _ in encoded):
        prefix += 1
    length = max(len(ids) for ids, _ in encoded)
    batch = len(encoded)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    labels = torch.full((batch, length), -100, dtype=torch.long)
    attention = torch.zeros((batch, length), dtype=torch.long)
    for row, (ids, label) in enumerate(encoded):  # right padding for training
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(label)] = torch.tensor(label)
        attention[row, : len(ids)] = 1
    if prefix == 0:
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    shared = model(input_ids=input_ids[:1, :prefix], use_cache=True)
    cache = shared.past_key_values
    cache.batch_repeat_interleave(batch)
    positions = torch.arange(prefix, length).unsqueeze(0).expand(batch, -1)
    rest = model(input_ids=input_ids[:, prefix:], attention_mask=attention, past_key_values=cache, position_ids=positions)
    # Logits at position t predict token t+1: the prefix's last logits predict the first suffix token.
    logits = torch.cat([shared.logits[:, -1:].expand(batch, -1, -1), rest.logits[:, :-1]], dim=1)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, prefix:].reshape(-1), ignore_index=-100)


def warm_start_data(task_config: TaskConfig, spec: WarmStartSpec) -> tuple[list[Problem], list[Problem]]:
    """(training problems, validation problems): every problem of the task's space except the
    held-out set, minus a validation slice; the held-out set is never seen by the warm start."""
    heldout = load_task(task_config).heldout
    space = _space_size(task_config) - len(heldout)
    pool = synthetic_problems(task_config, min(space, 20_000), stream="warm-start", exclude={p.id for p in heldout})
    validation = pool[: spec.validation_problems]
    return pool[spec.validation_problems :], validation


def warm_start(model, tokenizer, task_config: TaskConfig, spec: WarmStartSpec, seed: int, log=print) -> dict:
    train, validation = warm_start_data(task_config, spec)
    rng = random.Random(f"{seed}:warm-start")
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / max(1, spec.warmup_steps))
        * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, spec.max_steps))))),
    )
    sampling = SamplingConfig()
    history: list[dict] = []
    losses: list[float] = []
    step = 0
    while step < spec.max_steps:
        model.train()
        batch = [rng.choice(train) for _ in range(spec.batch_size)]
        encoded = [_encode_example(tokenizer, p, warm_start_target(p, rng, spec), task_config.system_prompt) for p in batch]
        loss = _batch_loss(model, encoded, tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if step % spec.check_every == 0:
            model.eval()
            success = measure_success(
                model, tokenizer, validation, task_config.system_prompt, samples_per_problem=1,
                temperature=sampling.temperature, max_new_tokens=sampling.max_new_tokens, seed=seed + step,
            )
            mean_loss = sum(losses[-spec.check_every :]) / spec.check_every
            history.append({"step": step, "loss": round(mean_loss, 4), "validation_success": success})
            log(f"warm start step {step}: loss {mean_loss:.3f}, validation success {success:.3f}")
    model.eval()
    return {"steps": step, "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])), "history": history,
            "train_problems": len(train), "validation_problems": len(validation)}


@torch.no_grad()
def sample_and_score(
    model, tokenizer, problems: list[Problem], system_prompt: str, *, samples_per_problem: int, temperature: float, max_new_tokens: int, seed: int
) -> list[tuple[str, bool]]:
    """(response text, whether its last \\boxed{} equals the answer) for every sample (HF generate, left-padded batches)."""
    from rl_core.envs.rewards import score_answer

    torch.manual_seed(seed)
    prompts = [build_messages(p, system_prompt) for p in problems for _ in range(samples_per_problem)]
    answers = [p.answer for p in problems for _ in range(samples_per_problem)]
    scored: list[tuple[str, bool]] = []
    for start in range(0, len(prompts), 64):
        chunk = prompts[start : start + 64]
        encoded = tokenizer.apply_chat_template(chunk, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True)
        output = model.generate(
            **encoded,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        scored.extend((text, score_answer(text, answer).success) for text, answer in zip(texts, answers[start : start + 64]))
    return scored


def measure_success(model, tokenizer, problems: list[Problem], system_prompt: str, **sampling) -> float:
    """Fraction of sampled responses whose last \\boxed{} equals the answer."""
    scored = sample_and_score(model, tokenizer, problems, system_prompt, **sampling)
    return sum(ok for _, ok in scored) / max(1, len(scored))


def describe_behaviour(scored: list[tuple[str, bool]]) -> dict[str, float]:
    """How often the model guesses, and how well each kind of response scores."""
    guesses = [ok for text, ok in scored if is_quick_guess(text)]
    worked = [ok for text, ok in scored if not is_quick_guess(text)]
    return {
        "guess_share": len(guesses) / max(1, len(scored)),
        "guess_success": sum(guesses) / max(1, len(guesses)),
        "worked_success": sum(worked) / max(1, len(worked)),
    }


# ---------------------------------------------------------------------------
# Build / ensure
# ---------------------------------------------------------------------------


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    warm_start: bool = True,
    spec: TinyModelSpec | None = None,
    warm: WarmStartSpec | None = None,
    threads: int | None = None,
    log=print,
) -> Path:
    """Build the tiny model into `out_dir` (replacing it) and return the path.

    The directory appears complete or not at all: it is assembled in a sibling
    temp dir and renamed into place, so a concurrent reader never sees half a model."""
    out_dir = Path(out_dir)
    spec = spec or TinyModelSpec()
    warm = warm or WarmStartSpec()
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    started = time.time()
    try:
        tokenizer = build_tokenizer(seed, spec.vocab_size)
        model = build_model(tokenizer, spec, seed)
        task_config = TaskConfig(seed=seed)
        record: dict = {
            "seed": seed,
            "architecture": "Qwen2ForCausalLM",
            "spec": asdict(spec),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer),
            "warm_start": None,
        }
        if warm_start:
            trained = warm_start_fn(model, tokenizer, task_config, warm, seed, log=log)
            sampling = SamplingConfig()
            heldout = load_task(task_config).heldout[: warm.eval_problems]
            scored = sample_and_score(
                model,
                tokenizer,
                heldout,
                task_config.system_prompt,
                samples_per_problem=warm.eval_samples_per_problem,
                temperature=sampling.temperature,
                max_new_tokens=sampling.max_new_tokens,
                seed=seed,
            )
            success = sum(ok for _, ok in scored) / max(1, len(scored))
            greedy = measure_success(
                model, tokenizer, heldout, task_config.system_prompt, samples_per_problem=1, temperature=0.0,
                max_new_tokens=sampling.max_new_tokens, seed=seed,
            )
            record["warm_start"] = {
                "recipe": asdict(warm),
                **trained,
                "task": task_config.model_dump(mode="json"),
                "heldout_success_temperature_1": success,
                "heldout_success_greedy": greedy,
                "heldout_behaviour_temperature_1": describe_behaviour(scored),
                "heldout_problems": len(heldout),
                "max_new_tokens": sampling.max_new_tokens,
            }
            log(f"held-out success: {success:.3f} at temperature 1.0, {greedy:.3f} greedy; "
                f"{record['warm_start']['heldout_behaviour_temperature_1']}")
        record["build_seconds"] = round(time.time() - started, 1)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "bootstrap.json").write_text(json.dumps(record, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        torch.set_num_threads(previous_threads)
    return out_dir


warm_start_fn = warm_start  # build_tiny_model's `warm_start` flag shadows the function name


def is_built(path: str | Path) -> bool:
    path = Path(path)
    return (path / "bootstrap.json").is_file() and (path / "model.safetensors").is_file()


def ensure_tiny_model(path: str | Path, *, seed: int = 0, log=print) -> Path:
    """The model at `path`, built (warm-started) first if missing. Safe to call from many processes at once."""
    path = Path(path)
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the second caller waits, then finds it built
        if not is_built(path):
            build_tiny_model(path, seed=seed, warm_start=True, threads=1, log=log)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core bootstrap-tiny", description=__doc__.split("\n")[0])
    parser.add_argument("dir", nargs="?", default=DEFAULT_TINY_MODEL_DIR, help=f"Output directory (default {DEFAULT_TINY_MODEL_DIR}).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the tokenizer corpus, the init and the warm start.")
    parser.add_argument("--force", action="store_true", help="Rebuild even if DIR already holds a model.")
    parser.add_argument("--no-warm-start", action="store_true", help="Random weights only (seconds; for tests).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the warm start.")
    args = parser.parse_args(argv)
    if args.seed < 0:
        print("--seed must be >= 0", file=sys.stderr)
        return 2
    if is_built(args.dir) and not args.force:
        print(f"{args.dir} already holds a model (use --force to rebuild)")
        return 0
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    path = build_tiny_model(args.dir, seed=args.seed, warm_start=not args.no_warm_start, threads=args.threads, log=log)
    record = json.loads((path / "bootstrap.json").read_text())
    print(json.dumps({"path": str(path), **{k: record[k] for k in ("num_parameters", "build_seconds")},
                      "heldout_success": (record["warm_start"] or {}).get("heldout_success_temperature_1")}))
    return 0
