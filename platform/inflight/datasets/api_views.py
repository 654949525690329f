"""The datasets API (token auth like the rest of /api/; another user's dataset answers 404):

    GET    /api/datasets/                     → {"datasets": [...], "count"}
    POST   /api/datasets/upload/?name=NAME    body: the JSONL file itself → 201 dataset
    POST   /api/datasets/  {"name", "path"}   register a file under a data root → 201 dataset
    GET    /api/datasets/<id>/                → dataset
    DELETE /api/datasets/<id>/                → {"deleted": id}

`path` of a dataset is what a run config names as `task.train_path` / `task.eval_path`. A
refused file is a 400 whose `fields` name each bad line (`{"file": ["line 3: row has no 'answer'"]}`).
The shapes of these answers and bodies are declared here, next to their routes.
"""

from __future__ import annotations

import io
from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Body, Query
from ninja.responses import Status
from pydantic import Field

from inflight.api import schema
from inflight.api.auth import ApiRouter
from inflight.api.errors import ApiError
from inflight.datasets import storage
from inflight.datasets.models import Dataset
from inflight.datasets import validation
from inflight.datasets.validation import NAME_RULE

router = ApiRouter(tags=["datasets"])
ERRORS: dict[int, type] = {400: schema.Error, 401: schema.Error, 404: schema.Error}
UPLOAD_MEDIA_TYPE = "application/x-ndjson"


class DatasetAnswer(schema.Answer):
    id: int
    name: str
    source: Literal["uploaded", "registered"] = Field(description="Uploaded into your folder, or registered by its path under a data root.")
    path: str = Field(description="The file, as a run config names it in task.train_path / task.eval_path.")
    rows: int = Field(description="Problems in the file.")
    size_bytes: int
    sha256: str
    created_at: datetime
    use: dict[str, str] = Field(description="The run config fields that train on it.")


class DatasetList(schema.Answer):
    datasets: list[DatasetAnswer]
    count: int


class DatasetRegister(schema.Body):
    name: str = Field(description=NAME_RULE)
    path: str = Field(description="A JSONL file under a data root (INFLIGHT_DATA_ROOTS).")


class DatasetDeleted(schema.Answer):
    deleted: int = Field(description="The id of the deleted dataset (an uploaded file is removed too).")


def _refused(exc: storage.DatasetRefused) -> ApiError:
    return ApiError(400, f"dataset refused: {exc.message}", fields={exc.field: exc.problems})


def _own(request: HttpRequest, dataset_id: int) -> Dataset:
    dataset = Dataset.objects.filter(owner=request.user, pk=dataset_id).first()
    if dataset is None:
        raise ApiError(404, f"you have no dataset {dataset_id}")
    return dataset


@router.get("/datasets/", response={200: DatasetList, 401: schema.Error}, url_name="datasets", summary="Your datasets, newest first")
def list_datasets(request: HttpRequest) -> Any:
    rows = [storage.dataset_json(d) for d in Dataset.objects.filter(owner=request.user)]
    return {"datasets": rows, "count": len(rows)}


@router.post("/datasets/", response={201: DatasetAnswer, 415: schema.Error, **ERRORS}, url_name="datasets",
             summary="Register a JSONL file under a data root as one of your datasets (checked, not copied)")
def register_dataset(request: HttpRequest, body: DatasetRegister = Body(...)) -> Any:
    try:
        dataset = storage.register_path(request.user, body.name, body.path)
    except storage.DatasetRefused as exc:
        raise _refused(exc) from exc
    return Status(201, storage.dataset_json(dataset))


@router.post("/datasets/upload/", response={201: DatasetAnswer, 413: schema.Error, **ERRORS}, url_name="dataset-upload",
             summary=f"Upload a JSONL file (the body itself, at most {validation.MAX_DATASET_BYTES // (1024 * 1024)} MiB) as one of your datasets",
             openapi_extra={"requestBody": {"required": True, "content": {UPLOAD_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
def upload_dataset(request: HttpRequest, name: str = Query(..., description=NAME_RULE)) -> Any:
    # The body is the file: read from the stream (request.body stops at the 1 MiB body limit).
    data = request.read(validation.MAX_DATASET_BYTES + 1)
    if len(data) > validation.MAX_DATASET_BYTES:
        raise ApiError(413, f"the file is over {validation.MAX_DATASET_BYTES // (1024 * 1024)} MiB (the limit of a dataset)")
    try:
        dataset = storage.store_upload(request.user, name, io.BytesIO(data))
    except storage.DatasetRefused as exc:
        raise _refused(exc) from exc
    return Status(201, storage.dataset_json(dataset))


@router.get("/datasets/{int:dataset_id}/", response={200: DatasetAnswer, **ERRORS}, url_name="dataset-detail", summary="One of your datasets")
def get_dataset(request: HttpRequest, dataset_id: int) -> Any:
    return storage.dataset_json(_own(request, dataset_id))


@router.delete("/datasets/{int:dataset_id}/", response={200: DatasetDeleted, **ERRORS}, url_name="dataset-detail", summary="Delete one of your datasets")
def delete_dataset(request: HttpRequest, dataset_id: int) -> Any:
    storage.delete_dataset(_own(request, dataset_id))
    return {"deleted": dataset_id}
