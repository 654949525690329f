"""Real model shapes without a hub: `python -m rl_core build-model --shape NAME DIR`.

A randomly initialised Qwen2 causal LM of a published architecture, written as an HF model
directory (safetensors + config + the tiny model's tokenizer), so the engine, both trainer
backends, the weight sync and every bench can run at the sizes users train, on machines that
reach no model hub. A random model's outputs are noise: it measures time, memory and bytes
moved, never learning (bench/real_size.py says how its trainer is kept busy).

Built in seconds: the module is made on the `meta` device (no memory, no init), and each
parameter is then drawn directly on the target device, in the target dtype, shard by shard,
as HF's own init draws it (linear and embedding weights ~ N(0, initializer_range), biases 0,
RMSNorm scales 1). Nothing is materialised twice, so a 7B model builds in host memory of one
shard.

`add_model_shape_args` / `model_for_bench` are the one `--shape --device --dtype` command line
of the benches (engine_throughput, real_size, trainer_step, weight_update).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rl_core.models.model_io import MODEL_DTYPES, model_dtype

# One safetensors file holds at most this many bytes; larger models are sharded with an
# index, as HF writes them (from_pretrained reads both), so the build never holds more.
SHARD_BYTES = 2 * 2**30


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 architecture's numbers. `source` says where they come from."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    source: str
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        """Parameter count (tied embeddings counted once), from the architecture alone."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = h * h + h + 2 * (h * kv + kv) + h * h  # q (with bias), k and v (with bias), o
        mlp = 3 * h * self.intermediate_size
        layer = attention + mlp + 2 * h  # two RMSNorm scales
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h  # final norm


# The Qwen2.5 numbers are those of the published config.json of Qwen/Qwen2.5-0.5B, -1.5B and
# -7B (hidden size, layers, heads, KV heads, intermediate size, vocabulary, tied embeddings,
# rope theta); their vocabularies (151,936 / 152,064 rows) cover the tiny tokenizer many times
# over, so the embedding and the LM head cost what they cost in the real models.
SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape(
            "tiny", hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True, rope_theta=10000.0,
            max_position_embeddings=1024, source="the tiny demo model's architecture (rl_core/models/tiny_model.py TinyModelSpec)",
        ),
        ModelShape(
            "125m", hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
            max_position_embeddings=1024, source="a ~125M Qwen2 (GPT-2-small width and depth, grouped K/V heads)",
        ),
        ModelShape(
            "qwen2.5-0.5b", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, source="Qwen/Qwen2.5-0.5B config.json",
        ),
        ModelShape(
            "qwen2.5-1.5b", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, source="Qwen/Qwen2.5-1.5B config.json",
        ),
        ModelShape(
            "qwen2.5-7b", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, source="Qwen/Qwen2.5-7B config.json",
        ),
    )
}


def shape_named(name: str) -> ModelShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"--shape: unknown shape {name!r}; expected one of {', '.join(SHAPES)}") from None


def default_dtype(device: str) -> str:
    """bfloat16 on a GPU (what users train in), float32 on a CPU (no fast bf16 matmuls there)."""
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def _tokenizer():
    """The tiny model's tokenizer: copied from the built tiny model when it is the same one (seed
    0, saves the BPE training), else trained (a few seconds; the same seed gives the same one)."""
    from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR
    from rl_core.models.tiny_model import TinyModelSpec, build_tokenizer, is_built

    tiny = Path(DEFAULT_TINY_MODEL_DIR)
    if is_built(tiny) and json.loads((tiny / "bootstrap.json").read_text()).get("seed") == 0:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tiny)
    return build_tokenizer(0, TinyModelSpec.vocab_size)


def qwen2_config(shape: ModelShape, tokenizer, dtype: str):
    from transformers import Qwen2Config

    if shape.vocab_size < len(tokenizer):
        raise ValueError(f"shape {shape.name}: vocab_size {shape.vocab_size} does not cover the tokenizer's {len(tokenizer)} tokens")
    from rl_core.models.tiny_model import IM_END, IM_START, PAD

    return Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings, rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_norm_eps, initializer_range=shape.initializer_range,
        tie_word_embeddings=shape.tie_word_embeddings, use_sliding_window=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(IM_START), eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD), dtype=dtype,
    )


def _draw(name: str, shape: tuple[int, ...], std: float, dtype: torch.dtype, device: torch.device,
          generator: torch.Generator) -> torch.Tensor:
    """One parameter as HF's Qwen2 init draws it."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    if name.endswith("norm.weight"):
        return tensor.fill_(1.0)
    if name.endswith(".bias"):
        return tensor.zero_()
    return tensor.normal_(0.0, std, generator=generator)


def build_model(
    shape: ModelShape | str, directory: str | Path, *, device: str = "cpu", dtype: str | None = None, seed: int = 0,
) -> Path:
    """Write a randomly initialised model of `shape` into `directory` (created; files in it
    replaced) and return the directory. The weights are drawn on `device` in `dtype`."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen2ForCausalLM

    shape = shape_named(shape) if isinstance(shape, str) else shape
    dtype = dtype or default_dtype(device)
    torch_dtype = model_dtype(dtype)
    target = torch.device(device)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    config = qwen2_config(shape, tokenizer, dtype)
    with torch.device("meta"):
        skeleton = Qwen2ForCausalLM(config)  # names and shapes only; tied weights appear once
    generator = torch.Generator(device=target).manual_seed(seed)
    element = torch.empty((), dtype=torch_dtype).element_size()
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    shard_bytes = 0
    for name, parameter in skeleton.named_parameters():
        size = parameter.numel() * element
        if shards[-1] and shard_bytes + size > SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((name, tuple(parameter.shape)))
        shard_bytes += size
    for stale in list(directory.glob("model*.safetensors")) + list(directory.glob("model.safetensors.index.json")):
        stale.unlink()
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{index:05d}-of-{len(shards):05d}.safetensors" for index in range(1, len(shards) + 1)]
    weight_map: dict[str, str] = {}
    for file_name, members in zip(names, shards):
        state = {name: _draw(name, size, shape.initializer_range, torch_dtype, target, generator) for name, size in members}
        save_file(state, str(directory / file_name), metadata={"format": "pt"})
        weight_map.update({name: file_name for name in state})
        del state
    if len(names) > 1:
        total = sum(math.prod(size) for members in shards for _, size in members) * element
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(directory)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "model_shape.json").write_text(json.dumps(
        {**asdict(shape), "num_parameters": shape.num_parameters, "dtype": dtype, "device": str(target), "seed": seed},
        indent=2) + "\n")
    return directory


# --- the benches' command line --------------------------------------------------------


def add_model_shape_args(parser: argparse.ArgumentParser, default_shape: str = "tiny") -> None:
    """`--shape`, `--device`, `--dtype` (and `--model`, an existing directory instead of a
    built shape): the one spelling of these flags in every bench."""
    parser.add_argument("--shape", default=default_shape, choices=sorted(SHAPES),
                        help=f"Randomly initialised architecture to build (default {default_shape}).")
    parser.add_argument("--device", default="cpu", help="Torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, choices=MODEL_DTYPES,
                        help="Parameter dtype (default: bfloat16 on cuda, float32 on cpu).")
    parser.add_argument("--model", default=None,
                        help="An existing HF model directory to use instead of building --shape.")


def bench_dtype(args: argparse.Namespace) -> str:
    return args.dtype or default_dtype(args.device)


def model_for_bench(args: argparse.Namespace, scratch: str | Path) -> Path:
    """The bench's model directory: `--model` as given, else `--shape` built under `scratch`
    on `--device` in the bench's dtype (a line on stderr says what and how long)."""
    if args.model:
        return Path(args.model)
    started = time.perf_counter()
    directory = build_model(args.shape, Path(scratch) / args.shape, device=args.device, dtype=bench_dtype(args))
    shape = SHAPES[args.shape]
    print(f"built {args.shape} ({shape.num_parameters / 1e6:.0f}M parameters, {bench_dtype(args)}, on {args.device}) "
          f"in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core build-model", description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="Output directory (created; its weight files are replaced).")
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES), help="Architecture to build.")
    parser.add_argument("--device", default="cpu", help="Device the weights are drawn on (cuda: seconds for 7B).")
    parser.add_argument("--dtype", default=None, choices=MODEL_DTYPES, help="Parameter dtype (default: bfloat16 on cuda, float32 on cpu).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        path = build_model(args.shape, args.dir, device=args.device, dtype=args.dtype, seed=args.seed)
    except (ValueError, RuntimeError) as exc:
        print(f"build-model: {exc}", file=sys.stderr)
        return 2
    shape = SHAPES[args.shape]
    print(json.dumps({"path": str(path), "shape": shape.name, "num_parameters": shape.num_parameters,
                      "dtype": args.dtype or default_dtype(args.device), "source": shape.source,
                      "build_seconds": round(time.perf_counter() - started, 1)}))
    return 0

