"""A bounded sample of each run's rollouts, for the rollout viewer.

The actor's stream (`stream/rollouts.jsonl`, one `contracts.RolloutSample` per line) is the
source; the worker tails it like metrics.jsonl. `(run, line)` is unique, `line` being the
sample's 0-based line in the stream, so a re-sent batch never duplicates a row. A sample the
actor discarded (`stream/discarded.jsonl`, `discarded` says why) is keyed by its line there
(`discard_line`) and stored under the step its stream position gives, kept and thinned like the rest.

Which samples are kept: every sample trained at a step that is a multiple of
`RolloutStore.stride` (starting at the run's `monitoring.rollouts.keep_every_n_steps`); when
more than `max_stored` rows are stored the stride doubles and the rows off the new grid are
deleted. So a run never holds more than `max_stored` rows, spread evenly over its steps.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from inflight.runs.models import Run


class RolloutStore(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    stride = models.IntegerField(help_text="Rows are kept for steps that are multiples of this.")
    stored = models.IntegerField(default=0, help_text="Rows stored now (kept <= max_stored).")
    seq = models.BigIntegerField(default=0, help_text="Ingest batches so far: the live push counter.")
    lines_seen = models.BigIntegerField(default=0, help_text="Stream lines delivered so far (kept or not).")


class StoredRollout(models.Model):
    # No database-level foreign key (as MetricPoint): ingest locks the run's store row, which
    # exists only for an existing run; deletes still cascade through the ORM.
    # Looked up by the (run, ...) indexes and unique constraints below: no index on `run` alone.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False)
    line = models.BigIntegerField(help_text="Idempotency key: 0-based line of the sample in stream/rollouts.jsonl.")
    step = models.BigIntegerField(help_text="Trainer step that trains it (from its place in the stream).")
    seq = models.BigIntegerField(help_text="RolloutStore.seq of the batch that stored it.")
    sample_id = models.CharField(max_length=200)
    group_id = models.CharField(max_length=200)
    prompt_id = models.CharField(max_length=200)
    prompt_text = models.TextField()
    problem_text = models.TextField(
        blank=True, default="", help_text="The prompt's last user message (the problem), what the table shows; empty: rows stored before it existed."
    )
    completion_text = models.TextField()
    tokens = ArrayField(models.TextField(), help_text="Completion tokens as text, one per token id.")
    token_ids = ArrayField(models.IntegerField())
    logprobs = ArrayField(models.FloatField(), help_text="Behaviour (sampling) logprob per completion token.")
    versions = ArrayField(models.IntegerField(), help_text="Policy version that sampled each completion token.")
    train_logprobs = ArrayField(
        models.FloatField(), null=True, blank=True, help_text="Trainer logprob per token when the run recorded it (importance ratios)."
    )
    # A multi-turn (tool-using) sample: which completion tokens the policy sampled and which a tool
    # returned (context only: never trained, no ratio), and the turns they form (RolloutSample's
    # `completion_mask` and `metadata["turns"]`). Null: a single-turn sample, every token the policy's.
    completion_mask = ArrayField(
        models.SmallIntegerField(), null=True, blank=True, help_text="Per completion token: 1 = sampled by the policy, 0 = tool output. Null: all 1."
    )
    turns = models.JSONField(
        null=True, blank=True,
        help_text='[{kind: "model"|"tool", start, end (completion-token offsets), and for a tool turn status, seconds}]; null: one model turn.',
    )
    tool_calls = models.IntegerField(default=0, help_text="Tool calls the sample made (metadata.tool_calls).")
    env = models.CharField(max_length=64, blank=True, default="", help_text="The run's environment (metadata.env); empty: not recorded.")
    reward = models.FloatField()
    correct = models.BooleanField()
    advantage = models.FloatField()
    length = models.IntegerField(help_text="Completion tokens.")
    min_version = models.IntegerField()
    max_version = models.IntegerField()
    versions_spanned = models.IntegerField(help_text="Distinct policy versions among its tokens.")
    max_lag = models.IntegerField(help_text="Trainer version at its step minus its oldest token's version.")
    extracted = models.CharField(max_length=200, blank=True, default="")
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    t = models.FloatField(help_text="Unix seconds when the platform stored it.")
    # A sample the actor scored but did not train (stream/discarded.jsonl): why, and its line in that
    # file (its idempotency key). Its `line` is where it would have been in the stream, so it sorts
    # and is filed under a step among the trained samples of its time; "" / null: a trained sample.
    discarded = models.CharField(
        max_length=32, blank=True, default="", help_text="Why it was not trained (contracts.DISCARD_REASONS); empty: trained."
    )
    discard_line = models.BigIntegerField(
        null=True, blank=True, help_text="Idempotency key of a discarded sample: 0-based line in stream/discarded.jsonl."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "line"], condition=models.Q(discard_line__isnull=True), name="storedrollout_run_line_uniq"),
            models.UniqueConstraint(
                fields=["run", "discard_line"], condition=models.Q(discard_line__isnull=False), name="storedrollout_run_discard_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["run", "step"], name="storedrollout_run_step"),
            models.Index(fields=["run", "group_id"], name="storedrollout_run_group"),
        ]
