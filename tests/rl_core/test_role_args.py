"""The flags every role shares have one owner (rl_core/rundir/role_args.py): the launcher writes
them and the actor and the trainer read them with the same parser, each adding its own flags
(issue 32 §4). A role that drifted from the launcher's command line fails here, not mid-run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_core.actor.main import build_parser as actor_parser
from rl_core.config.run_config import RunConfig
from rl_core.launch.launcher import place_run, trainer_children
from rl_core.rundir.layout import write_servers
from rl_core.rundir.role_args import role_flags, role_servers
from rl_core.trainer.loop import build_parser as trainer_parser


@pytest.mark.parametrize("parser", [actor_parser, trainer_parser], ids=["actor", "trainer"])
def test_every_role_reads_the_shared_flags_as_the_launcher_writes_them(parser, tmp_path: Path) -> None:
    given = parser().parse_args(role_flags(tmp_path, ["http://a:1", "http://b:2"]))
    assert (Path(given.run_dir), given.await_servers, role_servers(given)) == (tmp_path, False, ["http://a:1", "http://b:2"])
    write_servers(tmp_path, ["http://c:3"])
    awaited = parser().parse_args(role_flags(tmp_path, None))
    assert awaited.await_servers and role_servers(awaited) == ["http://c:3"]


def test_the_launchers_trainer_command_parses_with_the_trainers_own_flags(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"model": {"path": str(tmp_path)}})
    [spec] = trainer_children(config, place_run(config, []), tmp_path, tmp_path / "model", None, resume=True, master_port=1)
    assert spec.command[1:4] == ["-m", "rl_core", "trainer"]
    args = trainer_parser().parse_args(spec.command[4:])
    assert (Path(args.run_dir), args.await_servers, args.resume, args.model) == (tmp_path, True, True, str(tmp_path / "model"))
    assert args.weight_sync_backend in ("gloo", "nccl")
