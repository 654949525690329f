"""A thin httpx client of /api/ that turns every failure into one readable `ApiFailure`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from inflight_cli.credentials import Credentials

TIMEOUT_S = 30.0


class ApiFailure(Exception):
    """What went wrong, worded for the terminal; `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _explain(response: httpx.Response, url: str) -> ApiFailure:
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("error") if isinstance(body, dict) else None
    fields = body.get("fields") if isinstance(body, dict) else None
    if response.status_code == 401:
        return ApiFailure(f"the server at {url} refused the token (401): run `inflight login` again or set INFLIGHT_TOKEN", 401)
    message = detail or f"{response.status_code} {response.reason_phrase} from {response.request.url}"
    if isinstance(fields, dict) and fields:
        message += "".join(f"\n  {name}: {'; '.join(map(str, errors)) if isinstance(errors, list) else errors}" for name, errors in fields.items())
    return ApiFailure(message, response.status_code)


class Client:
    def __init__(self, credentials: Credentials, timeout_s: float = TIMEOUT_S) -> None:
        self.url = credentials.url
        self.http = httpx.Client(
            base_url=credentials.url, timeout=timeout_s, follow_redirects=False,
            headers={"Authorization": f"Token {credentials.token}", "Accept": "application/json"},
        )

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiFailure(f"cannot reach the Inflight server at {self.url} ({type(exc).__name__}: {exc}); is it running? "
                             "Check the address given to `inflight login` or INFLIGHT_URL") from exc
        if response.status_code >= 400:
            raise _explain(response, self.url)
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {}).json()

    def download(self, path: str, target: Path) -> int:
        """Stream a download to `target` (written to a .part file first); returns its size."""
        part = target.with_name(target.name + ".part")
        try:
            with self.http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _explain(response, self.url)
                size = 0
                with part.open("wb") as out:
                    for chunk in response.iter_bytes(1024 * 1024):
                        out.write(chunk)
                        size += len(chunk)
        except httpx.TransportError as exc:
            part.unlink(missing_ok=True)
            raise ApiFailure(f"download of {path} from {self.url} broke off ({type(exc).__name__}: {exc})") from exc
        part.replace(target)
        return size
