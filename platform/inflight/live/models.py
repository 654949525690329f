"""An incrementally maintained copy of each run's downsampled snapshot.

Scanning a 1M-point run for every page load costs seconds; but min, max and the
lexicographic "last" are associative and idempotent, so the buckets can be kept
up to date by folding in only the batches stored since (`seq` > cursor), which
the `(run, seq)` index of MetricPoint finds directly. `SnapshotCursor` says how
far the buckets reach and on which grid they are; when a run outgrows the grid
the buckets are coarsened in place by merging pairs — exactly what a fresh
`GROUP BY step >> shift` would give.
"""

from __future__ import annotations

from django.db import models

from inflight.runs.models import Run


class SnapshotCursor(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    seq = models.BigIntegerField(default=0, help_text="Ingest batches 1..seq are folded into the buckets.")
    shift = models.IntegerField(default=0, help_text="Bucket width is 2**shift trainer steps.")
    max_step = models.BigIntegerField(null=True, blank=True, help_text="Largest step folded in (chooses the grid).")


class SnapshotBucket(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=120)
    bucket = models.BigIntegerField(help_text="step >> shift of the points it holds.")
    min_value = models.FloatField()
    max_value = models.FloatField()
    last_step = models.BigIntegerField(help_text="Step of the bucket's last point (largest (step, t, value)).")
    last_t = models.FloatField()
    last_value = models.FloatField()

    class Meta:
        # The bucket's figures ride in the unique index (INCLUDE): a snapshot, the compare page and the
        # run list's sparklines read them by an index-only scan, not one heap page per bucket (the
        # buckets of a run are scattered over the table, written as its steps come in among other
        # runs'). 2,000 runs' run list sparklines: 835 -> 209 ms cold (bench/platform_scale.py).
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name", "bucket"], name="snapshotbucket_run_name_bucket",
                include=["min_value", "max_value", "last_step", "last_t", "last_value"],
            )
        ]
