"""Where the client finds its server and token: INFLIGHT_URL / INFLIGHT_TOKEN, else the file
`inflight login` wrote (~/.config/inflight/credentials.json, or under $XDG_CONFIG_HOME), mode 0600
in a 0700 folder since the token is as good as the user's password for the API."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "INFLIGHT_URL"
TOKEN_ENV = "INFLIGHT_TOKEN"
CREDENTIALS_FILE_NAME = "credentials.json"


class NotLoggedIn(Exception):
    """No server or token: the message says how to give them."""


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str


def credentials_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "inflight" / CREDENTIALS_FILE_NAME


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def save(credentials: Credentials) -> Path:
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    # Created 0600 from the start (never world-readable for a moment), then replaced atomically.
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": credentials.url, "token": credentials.token}, out)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def load() -> Credentials:
    """The environment wins over the file, variable by variable."""
    stored: dict[str, str] = {}
    path = credentials_path()
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise NotLoggedIn(f"cannot read {path}: {exc}; run `inflight login` again") from exc
    url = os.environ.get(URL_ENV) or stored.get("url", "")
    token = os.environ.get(TOKEN_ENV) or stored.get("token", "")
    if not url or not token:
        missing = " and ".join(name for name, value in ((URL_ENV, url), (TOKEN_ENV, token)) if not value)
        raise NotLoggedIn(f"no server or token: run `inflight login` or set {missing}")
    return Credentials(url=normalise_url(url), token=token.strip())
