"""The torch side of a model's files, shared by the engine, both trainer backends and the
weight sync (each used to keep its own copy):

- dtype names as configs, flags and the weight-update wire spell them ↔ torch dtypes: one
  table (`TORCH_DTYPES`); models load in `MODEL_DTYPES` only (the `model.dtype` choices),
  the wire also carries float64 buffers;
- `copy_side_files`: the files of an HF model directory that are not weights (tokenizer,
  chat template, generation config), copied into every checkpoint so that it is a
  complete, servable model directory;
- `use_tf32_matmul`: float32 matrix products on the tensor cores of an Ampere or later GPU,
  for every process that computes with a model (engine, both trainer backends).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
}
MODEL_DTYPES = ("float32", "bfloat16", "float16")

MODEL_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "chat_template.jinja", "generation_config.json", "added_tokens.json")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a wire name ("float32" or "torch.float32"); ValueError names the choices."""
    try:
        return TORCH_DTYPES[name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(TORCH_DTYPES)}") from None


def model_dtype(name: str) -> torch.dtype:
    """The torch dtype a model's parameters load in; ValueError for anything but `MODEL_DTYPES`."""
    if name not in MODEL_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(MODEL_DTYPES)}, got {name!r}")
    return TORCH_DTYPES[name]


def copy_side_files(model_dir: str | Path, checkpoint_dir: str | Path) -> None:
    """Copy the model directory's non-weight files into a checkpoint (never over one it has)."""
    source_dir, target_dir = Path(model_dir), Path(checkpoint_dir)
    for name in MODEL_SIDE_FILES:
        source = source_dir / name
        if source.is_file() and not (target_dir / name).exists():
            shutil.copy2(source, target_dir / name)


def use_tf32_matmul(device: torch.device | str) -> bool:
    """On an Ampere-or-later CUDA device, let float32 matmuls and convolutions run as TF32
    (`set_float32_matmul_precision("high")`): ~8x the float32 rate on the tensor cores, 10-bit
    mantissa products accumulated in float32, the precision PyTorch and vLLM use for float32
    training and serving on such cards. Left alone elsewhere (a CPU, an older GPU: no TF32
    there); process-wide, so called once the process knows its device. True where it is set."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device)[0] < 8:
        return False
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return True


def synchronize_device(device: torch.device | str | None) -> None:
    """Wait for the work queued on `device` (CUDA runs kernels asynchronously). Every update
    timing calls it before it stops its clock: without it an NCCL broadcast or a device copy
    would be timed at its launch, not at its end. A no-op on CPU."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
