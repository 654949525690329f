"""Every `.venv/bin/python -m rl_core ...` command of README.md's "The engine on its own" block,
run as written.

The commands are parsed out of README.md, so a README edit that no longer runs breaks this
test. Each runs in a sandbox laid out like a fresh checkout (`.venv`, `rl_core/`, `examples/`,
`var/models/tiny` linked from this one; `../shared/data` next to it), so the relative paths
resolve exactly as for a user and whatever a command writes (`runs/demo`, `var/eval/...`)
lands in a temporary directory. What is added, and only where a command would otherwise run
for minutes or forever: `run` gets `--set` overrides that make it a few steps long, and
`serve` is stopped after answering one request (on another port if 8001 is taken here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from rl_core.rundir.layout import parse_ready_line

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = [".venv/bin/python", "-m", "rl_core"]
# A few steps of the demo config instead of 200; everything else as in examples/tiny-cpu.yaml.
SHORT_RUN = [
    "trainer.max_steps=2", "trainer.samples_per_step=8", "trainer.checkpoint_every=1",
    "actor.group_size=4", "actor.groups_in_flight=2", "sampling.max_new_tokens=24",
    "task.heldout_size=4", "eval.heldout_k=1", "inference.max_batch_size=16",
]


def readme_commands(readme: Path = REPO_ROOT / "README.md") -> list[list[str]]:
    """The rl_core command lines of the first bash block under "## The engine on its own"."""
    text = readme.read_text(encoding="utf-8")
    section = re.search(r"^## The engine on its own\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## The engine on its own' section"
    block = re.search(r"```bash\n(.*?)```", section.group(1), re.S)
    assert block, "the section has no ```bash block"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    commands = [command for command in commands if command]
    for command in commands:
        assert command[:3] == PREFIX, f"not an rl_core command: {shlex.join(command)}"
    return commands


def split_optional(command: list[str]) -> tuple[list[str], list[list[str]]]:
    """`run X [--set a=b] [--resume]` -> (the required words, [["--set", "a=b"], ["--resume"]])."""
    required: list[str] = []
    optional: list[list[str]] = []
    group: list[str] | None = None
    for word in command:
        if group is None and word.startswith("["):
            group, word = [], word[1:]
        if group is not None:
            closing = word.endswith("]")
            group.append(word[:-1] if closing else word)
            if closing:
                optional.append(group)
                group = None
        else:
            required.append(word)
    assert group is None, f"unclosed [ in {shlex.join(command)}"
    return required, optional


def by_name(name: str) -> list[str]:
    matches = [command for command in readme_commands() if command[3] == name]
    assert len(matches) == 1, f"README shows {len(matches)} `rl_core {name}` commands"
    return matches[0]


def test_the_readme_block_is_what_this_file_runs() -> None:
    # A new command in the block needs a test here (a long-running one cannot be run blindly).
    assert [command[3] for command in readme_commands()] == ["bootstrap-tiny", "run", "validate", "eval", "serve"]
    assert split_optional(shlex.split("a b [--set x=1] [--resume] c")) == (["a", "b", "c"], [["--set", "x=1"], ["--resume"]])


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, shared_data_dir: Path) -> Path:
    """A directory laid out like a fresh checkout, its `../shared/data` beside it."""
    if not (REPO_ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv here (the README commands run .venv/bin/python; `make test` creates it)")
    root = tmp_path_factory.mktemp("readme")
    checkout = root / "checkout"
    (checkout / "var" / "models").mkdir(parents=True)
    for name in (".venv", "rl_core", "examples"):
        (checkout / name).symlink_to(REPO_ROOT / name)
    (checkout / "var" / "models" / "tiny").symlink_to(tiny_model.resolve())
    (root / "shared").mkdir()
    (root / "shared" / "data").symlink_to(shared_data_dir.resolve())
    return checkout


def environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("INFLIGHT_TINY_MODEL", "INFLIGHT_SHARED_DATA")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_command(checkout: Path, command: list[str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=checkout, env=environment(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(command)} -> {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_bootstrap_tiny(checkout: Path) -> None:
    # The model is there (built once per machine): the command as written finds it and returns.
    done = run_command(checkout, by_name("bootstrap-tiny"), timeout=120)
    assert "already holds a model" in done.stdout


def test_validate(checkout: Path) -> None:
    done = run_command(checkout, by_name("validate"), timeout=120)
    assert "tiny-cpu" in done.stdout


def test_eval(checkout: Path) -> None:
    command = by_name("eval")
    done = run_command(checkout, command, timeout=400)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    words = dict(zip(command[4::2], command[5::2]))
    assert summary["benchmark"] == words["--benchmark"] and summary["k"] == int(words["--k"])
    rows = [json.loads(line) for line in (checkout / summary["results_file"]).read_text().splitlines()]
    assert len(rows) == int(words["--max-problems"])
    skipped = [row for row in rows if row["skipped"]]
    # A problem longer than the model's context is skipped and counted, the others scored.
    assert summary["skipped_too_long"] == len(skipped) and summary["num_problems"] == len(rows) - len(skipped)
    assert summary["num_samples"] == summary["num_problems"] * summary["k"]


def test_run_then_resume_with_the_optional_flags(checkout: Path) -> None:
    required, optional = split_optional(by_name("run"))
    out = checkout / required[required.index("--out") + 1]
    shorten = [word for override in SHORT_RUN for word in ("--set", override)]
    run_command(checkout, required + shorten, timeout=400)
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    # The bracketed options: another --set and --resume (continuing the run just made).
    extra = [word for group in optional for word in group]
    assert "--resume" in extra
    run_command(checkout, required + shorten + ["--set", "trainer.max_steps=3"] + extra, timeout=400)
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    assert (out / "checkpoints" / "latest").resolve().name == "step_000003"


def free_port_or(port: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return port
        except OSError:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]


def test_serve_answers_a_chat_request(checkout: Path) -> None:
    command = by_name("serve")
    port_index = command.index("--port") + 1
    command[port_index] = str(free_port_or(int(command[port_index])))
    server = subprocess.Popen(command, cwd=checkout, env=environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line)
            if parse_ready_line(line) is not None:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not ready.is_set():
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.1)
        url = f"http://127.0.0.1:{command[port_index]}"
        model = httpx.get(url + "/v1/models", trust_env=False, timeout=30).json()["data"][0]["id"]
        response = httpx.post(url + "/v1/chat/completions", trust_env=False, timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 16, "temperature": 0})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["token_ids"] and choice["token_versions"] == [0] * len(choice["token_ids"])
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert server.returncode in (0, -signal.SIGTERM), "".join(lines)[-3000:]
