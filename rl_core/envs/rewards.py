"""Rewards: math-verify on the last `\\boxed{}` of a response, with a hard timeout.

math-verify parses LaTeX with sympy, which can take unbounded time on
adversarial input, and its own timeouts use `signal.alarm` (main thread only).
So every check runs in a persistent worker *process* with a deadline: the
caller (any thread, any process) waits at most `timeout_s`; a worker that
overruns is killed and replaced, and the sample scores 0 with `timed_out`.
A response without `\\boxed{}` scores 0 without ever reaching the worker.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterable

BOX_COMMANDS = ("\\boxed", "\\fbox")


@dataclass(frozen=True)
class RewardResult:
    reward: float  # 1.0 correct, 0.0 otherwise
    success: bool
    extracted: str | None  # content of the last \boxed{} (None if there is none)
    timed_out: bool = False


def extract_last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (brace-matched), or of `\\boxed 5`; None if absent/unclosed."""
    best = -1
    command = ""
    for candidate in BOX_COMMANDS:
        position = text.rfind(candidate)
        if position > best:
            best, command = position, candidate
    if best < 0:
        return None
    rest = text[best + len(command) :]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        # `\boxed 5` form: the content runs to the next whitespace or `$`.
        token = rest.strip().split()[0] if rest.strip() else ""
        token = token.split("$")[0]
        return token or None
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:index].strip()
    return None  # never closed: a truncated response has no answer


# ---------------------------------------------------------------------------
# The worker: math-verify in its own process
# ---------------------------------------------------------------------------


def _verify(extracted: str, reference: str) -> bool:
    """Runs inside the worker. Both sides parsed as LaTeX (then plain expression) and compared."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    # Wrapping in $...$ makes math-verify treat the whole string as one LaTeX answer.
    gold = parse(f"${reference}$", extraction_config=configs, parsing_timeout=None)
    if not gold:
        gold = parse(reference, extraction_config=configs, parsing_timeout=None)
    answer = parse(f"${extracted}$", extraction_config=configs, parsing_timeout=None)
    if not answer:
        answer = parse(extracted, extraction_config=configs, parsing_timeout=None)
    if not gold or not answer:
        return _normalise(extracted) == _normalise(reference)
    return bool(verify(gold, answer, timeout_seconds=None)) or _normalise(extracted) == _normalise(reference)


def _normalise(text: str) -> str:
    return "".join(text.split()).replace("\\left", "").replace("\\right", "").replace("\\!", "").rstrip(".")


def _worker_main() -> None:
    """The worker process: one JSON request per stdin line, one JSON verdict per stdout line."""
    import json
    import sys

    import math_verify  # noqa: F401  (import before announcing readiness: checks are timed from here on)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            extracted, reference = json.loads(line)
            verdict = _verify(extracted, reference)
        except Exception:  # a parse failure is a wrong answer, never a crash
            verdict = False
        sys.stdout.write("1\n" if verdict else "0\n")
        sys.stdout.flush()


class _Worker:
    """A `python -c` child (not multiprocessing: that would re-import the caller's __main__)."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from rl_core.envs.rewards import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            bufsize=0,
        )
        self.warm = False  # True once it has imported sympy/math-verify and said "ready"
        self._buffer = b""

    def _read_line(self, timeout_s: float) -> bytes | None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.process.stdout.fileno(), 64)
            if not chunk:
                raise EOFError("verifier worker exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.strip()

    def wait_ready(self, timeout_s: float) -> bool:
        if not self.warm:
            self.warm = self._read_line(timeout_s) == b"ready"
        return self.warm

    def ask(self, extracted: str, reference: str, timeout_s: float) -> bool | None:
        """The verdict, or None if no answer came within `timeout_s` (the caller then kills us)."""
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps([extracted, reference]) + "\n").encode())
        self.process.stdin.flush()
        line = self._read_line(timeout_s)
        return None if line is None else line == b"1"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class VerifierPool:
    """Persistent verifier processes, one request at a time each, with a deadline per check."""

    # Importing sympy + math-verify in a fresh worker takes seconds on a busy machine; that start-up
    # is not a check's fault, so it has its own limit and a check's deadline starts after it.
    STARTUP_GRACE_S = 60.0

    def __init__(self, num_workers: int = 1) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._available = threading.Semaphore(num_workers)
        self.num_workers = num_workers
        self.timeouts = 0

    def check(self, extracted: str, reference: str, timeout_s: float) -> tuple[bool, bool]:
        """(correct, timed_out)."""
        with self._available:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.process.poll() is not None:
                worker = _Worker()
            try:
                if not worker.wait_ready(self.STARTUP_GRACE_S):
                    raise OSError("verifier worker did not start")
                verdict = worker.ask(extracted, reference, timeout_s)
            except (EOFError, OSError):
                worker.kill()
                return False, False
            if verdict is None:
                worker.kill()  # it may be stuck in sympy forever: replace it (importing starts now)
                with self._lock:
                    self.timeouts += 1
                    self._idle.append(_Worker())
                return False, True
            with self._lock:
                self._idle.append(worker)
            return verdict, False

    def warm_up(self) -> None:
        """Start and import every worker now rather than on the first real check."""
        threads = [threading.Thread(target=self.check, args=("x+1", "1+x", 5.0)) for _ in range(self.num_workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.kill()


_default_pool: VerifierPool | None = None
_default_pool_lock = threading.Lock()


def default_pool() -> VerifierPool:
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None:
            _default_pool = VerifierPool(num_workers=int(os.environ.get("INFLIGHT_VERIFIER_WORKERS", "1")))
            atexit.register(_default_pool.close)
        return _default_pool


def _fast_path(extracted: str, reference: str) -> bool | None:
    """Plain integers/decimals compare exactly without sympy (most synthetic and AIME/GSM8K answers)."""
    a = extracted.replace("\\!", "").replace(",", "").strip().strip("$").strip()
    b = reference.replace("\\!", "").replace(",", "").strip().strip("$").strip()
    try:
        if a == b:
            return True
        return float(a) == float(b) if _is_number(a) and _is_number(b) else None
    except ValueError:
        return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.lower() not in {"nan", "inf", "-inf", "infinity", "-infinity"}


def score_answer(response_text: str, reference_answer: str, timeout_s: float = 2.0, pool: VerifierPool | None = None) -> RewardResult:
    """Reward of one response: 1 if the last `\\boxed{}` equals the reference (math-verify), else 0."""
    extracted = extract_last_boxed(response_text)
    if extracted is None or not extracted:
        return RewardResult(reward=0.0, success=False, extracted=extracted)
    quick = _fast_path(extracted, reference_answer)
    if quick is not None:
        return RewardResult(reward=float(quick), success=quick, extracted=extracted)
    correct, timed_out = (pool or default_pool()).check(extracted, reference_answer, timeout_s)
    return RewardResult(reward=float(correct), success=correct, extracted=extracted, timed_out=timed_out)


def score_many(
    responses: Iterable[tuple[str, str]], timeout_s: float = 2.0, pool: VerifierPool | None = None
) -> list[RewardResult]:
    """Score `(response_text, reference_answer)` pairs, using every worker of the pool in parallel."""
    pairs = list(responses)
    pool = pool or default_pool()
    results: list[RewardResult | None] = [None] * len(pairs)
    slow: list[int] = []
    for index, (text, reference) in enumerate(pairs):
        extracted = extract_last_boxed(text)
        if not extracted:
            results[index] = RewardResult(0.0, False, extracted)
            continue
        quick = _fast_path(extracted, reference)
        if quick is None:
            slow.append(index)
        else:
            results[index] = RewardResult(float(quick), quick, extracted)
    if slow:
        if pool.num_workers == 1 or len(slow) == 1:
            for index in slow:
                results[index] = score_answer(pairs[index][0], pairs[index][1], timeout_s, pool)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=pool.num_workers) as executor:
                scored = executor.map(lambda i: score_answer(pairs[i][0], pairs[i][1], timeout_s, pool), slow)
                for index, result in zip(slow, scored):
                    results[index] = result
    return [result for result in results if result is not None]
