"""The live-push sender: one failed send (Redis away) is logged and the next one still goes."""

from __future__ import annotations

from typing import Any

from inflight.live import broadcast


class FlakyLayer:
    """A channel layer whose first group_send fails, as Redis does while it restarts."""

    def __init__(self) -> None:
        self.calls = 0
        self.delivered: list[tuple[str, dict[str, Any]]] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("redis is restarting")
        self.delivered.append((group, message))


def test_a_failed_push_does_not_stop_later_pushes(monkeypatch) -> None:
    layer = FlakyLayer()
    monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(broadcast, "_broadcaster", broadcast._Broadcaster())

    broadcast.push("run-1", {"type": "metrics.batch", "seq": 1})
    assert broadcast.flush_broadcasts(timeout_s=5)
    broadcast.push("run-1", {"type": "metrics.batch", "seq": 2})
    assert broadcast.flush_broadcasts(timeout_s=5)

    assert layer.delivered == [("run-1", {"type": "metrics.batch", "seq": 2})]


def test_a_forwarded_push_is_encoded_once_by_its_sender(monkeypatch) -> None:
    """Rollout rows, scores and panel notices reach the channel layer as the page's JSON text (the
    web node forwards it to every open page as it is); pushes the consumer reads keep their shape."""
    import json

    layer = FlakyLayer()
    layer.calls = 1  # no failure this time
    monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(broadcast, "_broadcaster", broadcast._Broadcaster())
    rows = {"type": "rollouts.batch", "run_id": 3, "seq": 7, "rows": [{"id": 1, "prompt": "2 + 2 \u2014 \"four\""}]}
    broadcast.push("run-3", rows)
    broadcast.push("run-3", {"type": "metrics.batch", "seq": 1, "points": []})
    assert broadcast.flush_broadcasts(timeout_s=5)
    (_, forwarded), (_, metrics) = layer.delivered
    assert forwarded.keys() == {"type", "text"} and forwarded["type"] == "rollouts.batch" and json.loads(forwarded["text"]) == rows
    assert metrics == {"type": "metrics.batch", "seq": 1, "points": []}
