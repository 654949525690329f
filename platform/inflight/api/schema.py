"""The typed shapes of /api/: what each endpoint takes and answers (one owner).

The routes (api/routes.py and the modules it mounts) name these as their body and `response`
types, so django-ninja both serialises every answer through them and builds the served OpenAPI
document (/api/openapi.json) from them: what the document says is what the server sends. Answers
forbid unknown fields (`additionalProperties: false` in the document; a field a view adds without
declaring it here is a 500 that names it, caught by tests/platform/test_api_schema.py). Choices
(statuses, queues, ended reasons) are read from the models, limits from the constants the views
use, the run config's fields and help from rl_core's `RunConfig`.

A run's answer is read from the model (`Run.from_orm(run)`): a new column is one line here.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, Literal

from django.db.models import Model
from ninja import Schema
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, create_model, field_validator
from pydantic_core import core_schema
from typing_extensions import Annotated

from inflight.runs import models as run_models
from inflight.runs.summaries import SUMMARY_FIGURES
from rl_core.config.run_config import RunConfig


class DocumentedAs:
    """`Annotated[dict[str, Any], DocumentedAs(Model)]`: validated as the plain value it is, described
    in the OpenAPI document as `Model` (its fields and their help). The run config travels as a
    mapping — the runs service merges, defaults and validates it, naming the field at fault, and a
    stored config is answered as recorded — but is documented as the `RunConfig` it must be.

    The description is built once and inlined (no references): the document names the run config
    in many places (every run answer, every error that may carry a run), and regenerating the
    config's two dozen sections for each made the document take seconds to build."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self._described: dict[str, Any] | None = None

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: Any) -> Any:
        if self._described is None:
            described = self.model.model_json_schema()
            self._described = _inlined(described, described.pop("$defs", {}))
        return copy.deepcopy(self._described)


def _inlined(node: Any, definitions: dict[str, Any]) -> Any:
    """A JSON schema with each `{"$ref": "#/$defs/X", ...}` replaced by X itself (plus the other keys)."""
    if isinstance(node, list):
        return [_inlined(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        return {**_inlined(target, definitions), **{key: _inlined(value, definitions) for key, value in node.items() if key != "$ref"}}
    if list(node.get("allOf", [None])) and len(node.get("allOf", [])) == 1 and "$ref" in node["allOf"][0]:
        # pydantic wraps a described reference as {"allOf": [{"$ref": ...}], "description": ...}
        rest = {key: value for key, value in node.items() if key != "allOf"}
        return _inlined({**node["allOf"][0], **rest}, definitions)
    return {key: _inlined(value, definitions) for key, value in node.items()}


def choices_of(model: type[Model], field: str) -> Any:
    """A `Literal` of a model field's choices (with "" where the field may be blank)."""
    model_field = model._meta.get_field(field)
    values = tuple(value for value, _label in model_field.choices or ())
    if getattr(model_field, "blank", False) and "" not in values:
        values = ("", *values)
    return Literal[values]  # type: ignore[valid-type]


class Answer(Schema):
    """An answer's object: its fields are all it has (unknown fields are refused, not dropped)."""

    model_config = ConfigDict(extra="forbid")


class Body(Schema):
    """A request body: JSON types as sent (no "5" for 5, no "yes" for true), unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------- errors


class Error(Answer):
    error: str = Field(description="What went wrong, naming the field or parameter at fault.")
    fields: dict[str, list[str]] | None = Field(None, description="Per-field messages of a refused body or config (dotted paths).")
    run: Run | None = Field(None, description="503 on create/clone/resume: the run, recorded but failed because it could not be queued.")


# The error answers most routes may give: a refused parameter or body, no token, a run not visible.
ERRORS: dict[int, type[Error]] = {400: Error, 401: Error, 404: Error}


# ---------------------------------------------------------------- runs

RunStatusValue = choices_of(run_models.Run, "status")
RunQueueValue = choices_of(run_models.Run, "queue")
EndedReasonValue = choices_of(run_models.Run, "ended_reason")


class Run(Answer):
    # Read from the model's attributes, so it can hold no field it does not declare; ninja checks
    # `extra="forbid"` against the raw object before its resolvers run, so it is stated, not checked.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"additionalProperties": False})

    id: int
    name: str
    owner: str = Field(description="Username of the owner.")
    status: RunStatusValue = Field(description="Where the run is in its life (runs.models.RunStatus).")  # type: ignore[valid-type]
    queue: RunQueueValue = Field(description="Celery queue: `cluster` for cluster.enabled, else cpu or gpu from the config.")  # type: ignore[valid-type]
    error: str = Field(description="Why the run failed or was lost; empty otherwise.")
    ended_reason: EndedReasonValue = Field(  # type: ignore[valid-type]
        description="Why an ended run ended: max_steps (finished its steps), wall_time (stopped by its wall-time budget), "
        "cancelled, failed, hung (a role stopped answering) or lost; empty while it runs."
    )
    ended: str = Field(validation_alias=AliasChoices("ended_detail", "ended"), description="That in words with the step it ended at, e.g. 'stopped by its wall-time budget "
                       "(max_wall_time_s 60 s) at step 16 of 1000'; empty while it runs.")
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(description="The resolved run config, as the worker runs it.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    wall_time_s: float | None = Field(description="Seconds spent running, over every attempt.")
    worker: str = Field(validation_alias=AliasChoices("worker_name", "worker"), description="Celery worker that runs (or ran) it; empty while queued.")
    metrics_seq: int = Field(description="Cursor of the newest stored metric batch (see the metrics endpoint).")
    parent: int | None = Field(validation_alias=AliasChoices("parent_id", "parent"), description="The run this one was cloned or forked from.")
    parent_step: int | None = Field(description="The parent's checkpoint step a fork starts from.")
    tags: list[str]
    note: str
    archived: bool
    resume_count: int = Field(description="Times the run was resumed from a checkpoint.")

    # Read from a runs.models.Run (or from an answer, as clients and tests do): where the model
    # names a field differently, its name is tried first.
    @field_validator("owner", mode="before")
    @classmethod
    def _username(cls, owner: Any) -> Any:
        return owner.get_username() if hasattr(owner, "get_username") else owner

    @field_validator("tags", mode="before")
    @classmethod
    def _no_tags(cls, tags: Any) -> Any:
        return tags or []


def run_answer(run: run_models.Run) -> dict[str, Any]:
    """A run as the API answers it, for answers built outside a route's response (the 503 body)."""
    return Run.from_orm(run).model_dump(mode="json", by_alias=True)


class Page(Answer):
    count: int = Field(description="Items matching the filters, over all pages.")
    limit: int
    offset: int
    next: str | None = Field(description="URL of the next page; null on the last.")
    previous: str | None = Field(description="URL of the previous page; null on the first.")


class RunList(Page):
    runs: list[Run]


RUN_CREATE_EXAMPLE = {"name": "try", "config": {"trainer": {"max_steps": 20}}}


class RunCreate(Body):
    # An explicit example: one generated from the schema would set every config field to its bare
    # default, and a submitted default counts as chosen.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [RUN_CREATE_EXAMPLE]})

    name: StrictStr = Field("", description="Human-readable run name (the config's `name` when empty).")
    config: Annotated[Any, DocumentedAs(RunConfig)] = Field(
        default_factory=dict, description="The run config: the fields to set; the rest take the platform's defaults."
    )


class RunClone(Body):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{"name": "lr-up", "config": {"trainer": {"lr": 3e-4}}}]})

    name: StrictStr = Field("", description="Name of the new run (default: the source's name with -clone or -fork).")
    config: Annotated[Any, DocumentedAs(RunConfig)] = Field(None, description="Overrides merged into the source run's config.")
    from_step: StrictInt | None = Field(None, ge=0, description="Fork: start from the source run's checkpoint at this step.")


class RunUpdate(Body):
    tags: list[StrictStr] | None = Field(None, description="Replaces the tags (letters, digits, - _ . : /).")
    note: StrictStr | None = None
    archived: StrictBool | None = Field(None, description="Archived runs are hidden from lists unless asked for.")


class Deleted(Answer):
    deleted: int = Field(description="The id of the deleted run; a worker removes its directory.")


# ---------------------------------------------------------------- sweeps (runs.sweeps, runs.group_selectors)


class SweepCreate(Body):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"name": "lr-sweep", "config": {"trainer": {"max_steps": 20}}, "grid": {"trainer.lr": [1e-4, 3e-4]}, "seeds": 3}]})

    name: StrictStr = Field("", description="The sweep's name (the config's `name` when empty); each run is named after it and its point.")
    config: Annotated[Any, DocumentedAs(RunConfig)] = Field(default_factory=dict, description="The base config every run starts from.")
    grid: dict[StrictStr, list[Any]] = Field(default_factory=dict, description="{dotted config key: [values]}: one run per combination and seed.")
    seeds: StrictInt | list[StrictInt] = Field(1, description="How many seeds (0, 1, ... n-1) or the list of seeds; each sets the config's `seed`.")


class TimeFigure(Answer):
    mean: float | None
    sd: float | None = Field(description="Sample standard deviation; null under two runs.")


class SweepTimeToTarget(Answer):
    target: str = Field(description="+0.20: a gain over each run's first held-out value; 0.8: an absolute held-out success.")
    runs: int
    reached: int = Field(description="Runs that reached the target; the figures are over these only.")
    wall_s: TimeFigure
    steps: TimeFigure
    samples: TimeFigure


class SweepStatusCounts(Answer):
    queued: int
    running: int = Field(description="Starting, running or cancelling.")
    succeeded: int
    failed: int = Field(description="Failed or lost.")
    cancelled: int
    waiting: int = Field(description="Runs past your active-run limit, not created yet: queued one by one as your runs end.")


class SweepRefusal(Answer):
    name: str
    point: dict[str, Any] = Field(description="Its grid point and seed.")
    error: str = Field(description="Why the platform refused it when its turn came.")


class Sweep(Answer):
    id: int
    name: str
    owner: str = Field(description="Username of the owner.")
    created_at: datetime
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(description="The base config, as submitted.")
    grid: dict[str, list[Any]]
    seeds: list[int]
    run_count: int = Field(description="Runs the group holds now (waiting ones not included).")
    statuses: SweepStatusCounts
    run_ids: list[int]
    refused: list[SweepRefusal] = Field(description="Waiting runs refused when their turn came; empty normally.")


class SweepDetail(Sweep):
    runs: list[Run]
    time_to_target: SweepTimeToTarget


class SweepList(Page):
    sweeps: list[Sweep]


class Checkpoint(Answer):
    step: int
    t: float | None = Field(description="Unix seconds the checkpoint was written (trainer_state.json).")
    path: str
    evals: dict[str, float] = Field(description="Scores logged at that step, by benchmark (and `heldout`).")
    latest: bool


class CheckpointList(Answer):
    run: int
    checkpoints: list[Checkpoint]


# ---------------------------------------------------------------- metrics and evaluations


class MetricPointRecord(Answer):
    name: str
    step: int
    t: float = Field(description="Unix seconds when the value was logged.")
    value: float


class MetricPage(Answer):
    run: int
    since_seq: int
    seq: int = Field(description="The cursor: ask again with since_seq=seq for what follows.")
    columns: list[str] = Field(description="Fields of each point when format=rows: [name, step, t, value].")
    format: Literal["rows", "records"]
    points: list[Annotated[list[str | int | float], Field(min_length=4, max_length=4)]] | list[MetricPointRecord] = Field(
        description="format=rows (default): one [name, step, t, value] array per point, columns as in `columns`; "
        "format=records: one object per point with those fields named."
    )
    truncated: bool = Field(description="More points than `limit`: ask again from `seq`.")


class MetricSeries(Answer):
    b: list[int] = Field(description="Bucket index: the bucket covers steps [b * width, (b + 1) * width).")
    min: list[float | None]
    max: list[float | None]
    step: list[int] = Field(description="Step of the bucket's last point.")
    t: list[float] = Field(description="Unix seconds of the bucket's last point.")
    last: list[float | None] = Field(description="Value of the bucket's last point.")


class MetricSnapshot(Answer):
    run: int
    seq: int = Field(description="The metrics cursor this snapshot includes.")
    shift: int = Field(description="log2 of the bucket width.")
    width: int = Field(description="Steps per bucket.")
    max_step: int | None
    series: dict[str, MetricSeries] = Field(description="Per metric name: its downsampled buckets.")


class Eval(Answer):
    id: int
    run: int
    benchmark: str
    step: int
    k: int
    mean_at_k: float
    pass_at_k: float
    stderr: float | None
    num_problems: int
    num_samples: int
    policy_versions: list[int] = Field(description="Policy versions the samples were drawn with.")
    t: float


class EvalList(Answer):
    run: int
    evals: list[Eval]
    count: int


class EvalProblem(Answer):
    problem_id: str
    answer: str
    samples: list[str]
    extracted: list[str | None]
    verdicts: list[bool]
    mean: float
    # `pass` is a Python keyword: the attribute is pass_, the field (in answers and the document) `pass`.
    pass_: bool = Field(alias="pass", description="At least one of the k samples is correct.")
    used_tool: bool | None = Field(description="Its samples called a tool (a tool-using env); null: not recorded.")
    samples_used_tool: list[bool] | None = Field(description="Per sample: it called a tool; null: not recorded.")


class EvalDetail(Eval):
    problems: list[EvalProblem]


LeaderboardRow = create_model(  # the summary figures are runs.summaries' (one owner)
    "LeaderboardRow",
    __base__=Answer,
    run_id=(int, ...),
    name=(str, ...),
    owner=(str, ...),
    status=(RunStatusValue, ...),
    mode=(str | None, ...),
    env=(str, Field(description="The run's environment (env.name): math, math_python_tool, custom.")),
    created_at=(datetime, ...),
    wall_time_s=(float | None, ...),
    **{figure: (float | None, ...) for figure in SUMMARY_FIGURES},
)


class Leaderboard(Page):
    sort: str = Field(description="The sort applied (the default is chosen from what every listed run has).")
    rows: list[LeaderboardRow] = Field(description="One row per listed run on this page, sorted over every page.")  # type: ignore[valid-type]


class WorkerGpu(Answer):
    index: int | None
    name: str | None
    memory_total_mb: int | None
    memory_used_mb: int | None = Field(None, description="Staff only.")
    utilization: int | None = Field(None, description="Staff only.")


class ClusterNode(Answer):
    alive: bool | None
    cpus: float | None
    gpus: float | None
    memory_gb: float | None
    address: str | None = Field(None, description="Staff only.")
    hostname: str | None = Field(None, description="Staff only.")
    node_id: str | None = Field(None, description="Staff only.")


class Worker(Answer):
    name: str = Field(description="Staff: the Celery node name; others: `worker N`.")
    hostname: str = Field(description="Empty for non-staff.")
    queues: list[str]
    gpus: list[WorkerGpu]
    cpu_count: int
    started_at: datetime
    last_heartbeat: datetime
    alive: bool = Field(description="Its heartbeat is recent.")
    active_runs: int | None = Field(None, description="Staff only: runs it is driving now.")
    cluster_nodes: list[ClusterNode] = Field(description="A `cluster` worker's Ray nodes.")
    cluster_error: str


class Workers(Answer):
    workers: list[Worker]
    count: int


# ---------------------------------------------------------------- run files


class LogFile(Answer):
    name: str = Field(description="supervisor_child.log: the launcher's output; <process>.log: one engine process.")
    size: int


class LogList(Answer):
    run: int
    files: list[LogFile]
    count: int


class LogChunk(Answer):
    run: int
    name: str
    offset: int = Field(description="Where this chunk starts (0 when the asked offset was past a rewritten log's end).")
    next_offset: int = Field(description="Ask again with offset=next_offset to follow the log.")
    size: int = Field(description="The log's size now.")
    text: str


# ---------------------------------------------------------------- rollouts and alerts


class RolloutSummary(Answer):
    id: int
    line: int = Field(description="0-based line of the sample in the run's rollout stream.")
    step: int
    sample_id: str
    group_id: str
    prompt: str = Field(description="The problem (or prompt), shortened.")
    response: str = Field(description="The completion, shortened.")
    reward: float
    correct: bool
    length: int = Field(description="Completion tokens.")
    versions_spanned: int
    min_version: int
    max_version: int
    max_lag: int
    extracted: str
    tool_calls: int = Field(description="Tool calls the sample made (0 for a single-turn env).")
    env: str = Field(description="The environment that produced it (`math`, `math_python_tool`, ...); empty: not recorded.")
    discarded: str | None = Field(
        description="Why it was not trained: zero_advantage (its group's rewards were all equal and the run drops such "
        "groups), aborted (its server aborted the response), empty (no token), all three by the actor; stale (the trainer "
        "dropped it: its tokens were past actor.max_lag); null: a trained sample. A sample the actor discarded has the "
        "`line` and `step` it would have had in the stream."
    )


class RolloutTurn(Answer):
    kind: Literal["model", "tool"] = Field(description="model: tokens the policy sampled; tool: the tool's output (context only, never trained).")
    start: int = Field(description="First completion token of the turn.")
    end: int = Field(description="One past its last completion token.")
    status: str | None = Field(None, description="Tool turn: ok, error, timeout, output_limit or refused.")
    seconds: float | None = Field(None, description="Tool turn: how long the tool ran.")
    versions: list[int] | None = Field(None, description="Model turn: the policy versions of its tokens, in order.")
    updated_before: dict[str, int] | None = Field(
        None, description="Model turn: {from, to} when the weights changed since the previous model turn (an update landed between the turns)."
    )


class RolloutPage(Answer):
    run: int
    rollouts: list[RolloutSummary]
    next_cursor: int | None = Field(description="Ask again with cursor=next_cursor; null on the last page.")
    counts: dict[str, int] | None = Field(
        description="First page only (null with a cursor): rows under the other filters per kind, `trained` and one key per "
        "discard reason present."
    )


class RolloutDetail(RolloutSummary):
    prompt_id: str
    prompt_text: str
    completion_text: str
    advantage: float
    finish_reason: str
    tokens: list[str]
    token_ids: list[int]
    versions: list[int] = Field(description="Policy version that sampled each token.")
    logprobs: list[float] = Field(description="Behaviour (sampling) logprob of each token.")
    train_logprobs: list[float] | None = Field(description="The trainer's logprob of each token, where recorded.")
    ratios: list[float | None] | None = Field(description="Importance ratio exp(train - behaviour) per token; null at a tool's tokens (not the policy's).")
    ratios_missing: str | None = Field(description="Why there are no ratios.")
    version_switches: list[int] = Field(description="Token indices where the policy version changes (among the policy's tokens).")
    completion_mask: list[int] | None = Field(description="Per token: 1 = sampled by the policy, 0 = a tool's output (version -1, logprob 0). Null: every token the policy's.")
    turns: list[RolloutTurn] | None = Field(description="A multi-turn sample's turns in order; null: one model turn.")


class RolloutSibling(RolloutSummary):
    advantage: float


class RolloutGroup(Answer):
    run: int
    group_id: str
    prompt_text: str
    step: int
    samples: list[RolloutSibling]


class Alert(Answer):
    id: int
    run: int
    rule: str = Field(description="The rule that fired (alerts.rules).")
    title: str
    key: str = Field(description="What the rule watched, e.g. a benchmark.")
    step: int | None
    t: float = Field(description="Unix seconds when it fired.")
    message: str
    values: dict[str, Any] = Field(description="The values that made it fire (and the threshold).")


class AlertList(Answer):
    run: int
    alerts: list[Alert] = Field(description="Newest first.")


Error.model_rebuild()
