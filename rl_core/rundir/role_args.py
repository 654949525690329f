"""The command line every role the launcher starts shares: `--run-dir DIR` and where its inference
servers are (`--servers URL[,URL]`, or `--await-servers`: from servers.json once the launcher
writes it). One owner for the launcher, which writes these flags (`role_flags`), and the roles,
which read them (`role_parser`, then `role_servers`); each role adds its own flags to the parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rl_core.rundir.layout import SERVERS_WAIT_S, wait_for_servers


def role_flags(run_dir: str | Path, server_urls: list[str] | None) -> list[str]:
    """The shared part of a role's command line (`server_urls` None: read them from servers.json)."""
    servers = ["--await-servers"] if server_urls is None else ["--servers", ",".join(server_urls)]
    return ["--run-dir", str(run_dir), *servers]


def role_parser(role: str, description: str, servers_help: str) -> argparse.ArgumentParser:
    """`python -m rl_core <role>`'s parser with the shared flags; `servers_help` says what the
    role does with its servers."""
    parser = argparse.ArgumentParser(prog=f"python -m rl_core {role}", description=description)
    parser.add_argument("--run-dir", required=True, help="Run directory with config.yaml.")
    parser.add_argument("--servers", default="", help=f"Comma-separated inference server base URLs {servers_help}.")
    parser.add_argument("--await-servers", action="store_true",
                        help="Read the URLs from the run directory's servers.json once the launcher writes it "
                             f"(the launcher starts the {role} while the servers load).")
    return parser


def role_servers(args: argparse.Namespace) -> list[str]:
    """The servers' URLs the flags name: as given, or read once the launcher writes them (blocks,
    so a role calls it when it needs them, after loading what it can meanwhile)."""
    servers = [url for url in args.servers.split(",") if url]
    if args.await_servers:
        servers = wait_for_servers(Path(args.run_dir), SERVERS_WAIT_S)
    return servers
