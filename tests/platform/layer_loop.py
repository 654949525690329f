"""One event loop on its own thread for a test's channel-layer calls from sync code.

The pub/sub channel layer (settings.CHANNEL_LAYERS) keeps a process's subscriptions per event
loop, and `async_to_sync` runs each call on a fresh loop: a channel made by one call would not
exist for the next, and nothing would read its messages in between. A test runs them all here.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine


class LayerLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-layer-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def __enter__(self) -> LayerLoop:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
