"""rl_core by stage: every stage is a package with a docstring saying what lives there and what
it may import, every stage has its place in the layers contract, and no run-time import goes
from a lower stage to a higher one (import-linter, `[tool.importlinter]` in pyproject.toml)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RL_CORE = ROOT / "rl_core"


def stage_packages() -> list[str]:
    return sorted(p.name for p in RL_CORE.iterdir() if (p / "__init__.py").is_file())


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return [name.strip() for line in contract["layers"] for name in line.split("|")]


def test_every_stage_has_its_place_in_the_layers_contract() -> None:
    assert sorted(contract_layers()) == stage_packages()


def test_rl_core_keeps_no_flat_modules_beside_its_stages() -> None:
    assert sorted(p.name for p in RL_CORE.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_every_stage_says_what_lives_there_and_what_it_may_import() -> None:
    for name in stage_packages():
        doc = ast.get_docstring(ast.parse((RL_CORE / name / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"rl_core/{name}/__init__.py: its docstring does not say what it may import"
        for module in (RL_CORE / name).glob("*.py"):
            if module.name != "__init__.py":
                assert f"`{module.stem}`" in doc, f"rl_core/{name}/__init__.py does not name `{module.stem}`"


def test_no_stage_imports_a_higher_one_at_run_time() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_the_checkout_root_is_found_once_and_right() -> None:
    # After the move into packages, two modules still counted `.parent.parent` from their own file:
    # `.venv-vllm` was looked for inside rl_core/, so every vLLM test skipped as "not installed".
    from rl_core import CHECKOUT_ROOT
    from rl_core.inference.vllm_engine import VLLM_VENV

    assert (CHECKOUT_ROOT / "pyproject.toml").is_file() and VLLM_VENV.parent == CHECKOUT_ROOT == ROOT
    counting = [str(path.relative_to(ROOT)) for path in RL_CORE.rglob("*.py")
                if path.name != "__init__.py" and ".parent.parent" in path.read_text() and "__file__" in path.read_text()]
    assert counting == [], f"use rl_core.CHECKOUT_ROOT instead of counting folders from __file__: {counting}"
