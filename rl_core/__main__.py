"""`python -m rl_core <command>`: the engine's command line.

Each subcommand lives with the stage it belongs to; this file only dispatches,
so `python -m rl_core --help` lists everything a user can run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, function, one-line help). The function takes the argv tail.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "bootstrap-tiny": ("rl_core.models.tiny_model", "main", "Build the tiny Qwen2-style model + tokenizer offline and warm-start it."),
    "bootstrap-tiny-tools": ("rl_core.models.tiny_tools_model", "main", "Build the tools demo's variant of the tiny model (2-digit products, a few Python tool calls)."),
    "build-model": ("rl_core.models.model_shapes", "main", "Build a randomly initialised model of a published shape (qwen2.5-0.5b|1.5b|7b) offline."),
    "run": ("rl_core.launch.launcher", "main", "Run a whole RL run standalone: servers, actor, trainer."),
    "serve": ("rl_core.inference.server", "main", "Start one inference server (the PipelineRL HTTP contract)."),
    "actor": ("rl_core.actor.main", "main", "Run the rollout actor of a run (started by `run`)."),
    "trainer": ("rl_core.trainer.loop", "main", "Run the trainer of a run (started by `run`)."),
    "eval": ("rl_core.evaluation.cli", "main", "Evaluate a model on a benchmark (math500, aime24, ...)."),
    "validate": ("rl_core.launch.preflight", "validate_main", "Check a run config and the files it names, as `run` would, and print it resolved."),
    "cluster-nodes": ("rl_core.cluster.nodes", "main", "Print the Ray cluster's nodes as JSON (a cluster worker's heartbeat)."),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = argparse.ArgumentParser(prog="python -m rl_core", description="Inflight RL engine.")
        parser.add_argument("command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[2]}" for k, v in COMMANDS.items()))
        parser.print_help() if not argv or argv[0] in ("-h", "--help") else parser.parse_args(argv[:1])
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module_name, function_name, _ = COMMANDS[argv[0]]
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
