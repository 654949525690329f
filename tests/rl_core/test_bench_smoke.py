"""`make bench-smoke`'s runner (bench/smoke.py): each bench forked from the runner's warm
interpreter ends as `python bench/NAME.py --smoke` would — its exit status, its output in its log,
a traceback or an exit message on failure — and one still running at the timeout is killed with
everything it started. Stand-in benches are tiny scripts in a temporary bench folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))
import smoke  # noqa: E402

BENCHES = {
    "passes": "import sys\nprint('RESULT figure 1.5')\nprint(sys.argv[1:], flush=True)\n",
    "raises": "print('RESULT early 1')\nraise RuntimeError('the bench broke')\n",
    "exits_with_a_message": "import sys\nprint('RESULT early 2')\nsys.exit('bad settings')\n",
    "prints_nothing": "print('no figure')\n",
    "hangs": ("import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              "print(p.pid, flush=True)\ntime.sleep(300)\n"),
}


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "fresh"])
def test_each_bench_ends_as_its_own_script_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool) -> None:
    for name, code in BENCHES.items():
        (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.setattr(smoke, "BENCH_DIR", tmp_path)
    monkeypatch.setattr(smoke, "LOG_DIR", tmp_path / "logs")
    reported: list[str] = []
    outcomes = {o.name: o for o in smoke.run_all(sorted(BENCHES), jobs=2, timeout_s=8.0, warm=warm,
                                                 report=lambda outcome: reported.append(outcome.name))}
    assert sorted(reported) == sorted(BENCHES)
    assert outcomes["passes"].passed and outcomes["passes"].results == ["RESULT figure 1.5"]
    assert "['--smoke']" in (tmp_path / "logs" / "passes.log").read_text()
    for name, said in (("raises", "RuntimeError: the bench broke"), ("exits_with_a_message", "bad settings")):
        outcome = outcomes[name]
        assert outcome.returncode == 1 and said in outcome.tail, (name, outcome.returncode, outcome.seconds, outcome.tail)
    assert outcomes["prints_nothing"].returncode == 0 and outcomes["prints_nothing"].why() == "no RESULT line"
    hung = outcomes["hangs"]
    assert hung.returncode is None and hung.why().endswith("killed")
    sleeper = int(hung.tail.splitlines()[0])
    stat = Path(f"/proc/{sleeper}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z"  # killed with its bench's session
