"""The charts' step grid: power-of-two buckets, at most MAX_BUCKETS per series.

A series (one metric of one run) is cut into buckets of `2**shift` trainer steps:
bucket = step >> shift. Each bucket keeps the smallest and largest value (so a one-step
spike stays visible however far the chart is zoomed out) and the last point, where "last"
is the largest (step, t, value) triple — PostgreSQL (`live.selectors`, `live.folding`) and
the browser (`static/inflight/downsample.js`) compute it the same way.

Why powers of two: the width only ever doubles as a run grows, and a bucket of width 2w is
exactly the merge of buckets 2b and 2b+1 of width w, so a page holding a snapshot re-buckets
locally when the run outgrows the grid, and compared runs are brought onto one grid by
merging pairs. The Python reference of the whole algorithm, which the SQL and the JS are
tested against, lives with the tests (`tests/platform/downsample_oracle.py`).
"""

from __future__ import annotations

# At most this many buckets per series: ~1000 points per trace is what plotly
# draws smoothly for a dozen charts at once (static/inflight/downsample.js has the same bound).
MAX_BUCKETS = 1000


def shift_for_max_step(max_step: int | None) -> int:
    """Smallest shift such that steps 0..max_step fall into at most MAX_BUCKETS buckets."""
    if max_step is None or max_step < MAX_BUCKETS:
        return 0
    shift = 0
    while (max_step >> shift) >= MAX_BUCKETS:
        shift += 1
    return shift
