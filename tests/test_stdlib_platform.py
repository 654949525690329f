"""platform/ holds Django code but must never shadow the standard library's `platform`."""

from __future__ import annotations

import importlib
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_stdlib_platform_module_is_the_one_imported() -> None:
    import platform

    stdlib_dir = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(platform.__file__).resolve().parent == stdlib_dir
    assert callable(platform.python_version)


def test_platform_folder_is_not_a_package() -> None:
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()


def test_django_project_imports_under_its_own_name() -> None:
    inflight = importlib.import_module("inflight")
    assert Path(inflight.__file__).resolve().parent == REPO_ROOT / "platform" / "inflight"
