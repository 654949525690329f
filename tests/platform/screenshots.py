"""Where the browser tests put their screenshots.

`docs/screenshots/` is what the README shows; a test run writes there only when asked
(`INFLIGHT_UPDATE_SCREENSHOTS=1 make test`, then commit them), else into `var/screenshots/` (not
tracked), so that running the tests leaves the checkout as it was: a suite that re-took every tracked
screenshot dirtied the tree, and a provenance test that reads `git status` saw that as a change."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
UPDATE_VARIABLE = "INFLIGHT_UPDATE_SCREENSHOTS"
SCREENSHOTS = REPO_ROOT / ("docs/screenshots" if os.environ.get(UPDATE_VARIABLE) == "1" else "var/screenshots")
