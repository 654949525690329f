"""`inflight datasets upload|register|list|delete`: your own problem sets through the API
(/api/datasets/), for `task.kind: math_jsonl` runs (`--set task.train_path=<the printed path>`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from inflight_cli import credentials
from inflight_cli.client import ApiFailure, Client

UPLOAD_MEDIA_TYPE = "application/x-ndjson"


def _client() -> Client:
    return Client(credentials.load())


def _say(dataset: dict[str, Any], out: TextIO) -> None:
    out.write(f"dataset {dataset['id']} {dataset['name']}: {dataset['rows']} problems, {dataset['size_bytes']} bytes\n")
    out.write(f"  use it: --set task.kind=math_jsonl --set task.train_path={dataset['path']}\n")


def cmd_upload(args: argparse.Namespace, out: TextIO) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise ApiFailure(f"{path}: no such file")
    name = args.name or path.stem
    client = _client()
    response = client.request("POST", "/api/datasets/upload/", params={"name": name}, content=path.read_bytes(),
                              headers={"Content-Type": UPLOAD_MEDIA_TYPE})
    _say(response.json(), out)
    return 0


def cmd_register(args: argparse.Namespace, out: TextIO) -> int:
    _say(_client().post("/api/datasets/", {"name": args.name, "path": args.path}), out)
    return 0


def _find(client: Client, which: str) -> dict[str, Any]:
    listed = client.get("/api/datasets/")["datasets"]
    found = [d for d in listed if str(d["id"]) == which or d["name"] == which]
    if not found:
        names = ", ".join(d["name"] for d in listed) or "none yet"
        raise ApiFailure(f"you have no dataset {which!r} (yours: {names})")
    return found[0]


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    listed = _client().get("/api/datasets/")["datasets"]
    if args.json:
        out.write(json.dumps(listed, indent=1) + "\n")
        return 0
    rows = [["ID", "NAME", "ROWS", "BYTES", "SOURCE", "PATH"]] + [
        [str(d["id"]), d["name"], str(d["rows"]), str(d["size_bytes"]), d["source"], d["path"]] for d in listed]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n")
    return 0


def cmd_delete(args: argparse.Namespace, out: TextIO) -> int:
    client = _client()
    dataset = _find(client, args.dataset)
    client.request("DELETE", f"/api/datasets/{dataset['id']}/")
    out.write(f"dataset {dataset['id']} {dataset['name']} deleted\n")
    return 0


def add_commands(commands: Any) -> None:
    """The `datasets` command and its subcommands, on the main parser's subparsers."""
    datasets = commands.add_parser("datasets", help="your own datasets (JSONL of problems/answers): upload, register, list, delete")
    actions = datasets.add_subparsers(dest="datasets_command", required=True, metavar="ACTION")
    upload = actions.add_parser("upload", help="upload a JSONL file (checked: each bad line is named)")
    upload.add_argument("file")
    upload.add_argument("--name", help="dataset name (default: the file name without .jsonl)")
    upload.set_defaults(handler=cmd_upload)
    register = actions.add_parser("register", help="register a file already under a data root of the server, by its path")
    register.add_argument("name")
    register.add_argument("path")
    register.set_defaults(handler=cmd_register)
    listing = actions.add_parser("list", help="list your datasets")
    listing.add_argument("--json", action="store_true", help="print the API's JSON")
    listing.set_defaults(handler=cmd_list)
    delete = actions.add_parser("delete", help="delete one of your datasets (by id or name)")
    delete.add_argument("dataset")
    delete.set_defaults(handler=cmd_delete)
