"""`python -m inflight_cli` is the `inflight` command."""

from __future__ import annotations

from inflight_cli.main import main

raise SystemExit(main())
