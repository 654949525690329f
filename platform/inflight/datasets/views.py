"""The Datasets page: a user's own datasets, an upload form and a register-by-path form, and
delete. Session auth; another user's dataset answers 404 (its existence is not told)."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from inflight.datasets import storage
from inflight.datasets.models import Dataset
from inflight.datasets.validation import MAX_DATASET_BYTES, NAME_RULE


class UploadForm(forms.Form):
    name = forms.CharField(max_length=80, help_text=NAME_RULE)
    file = forms.FileField(help_text=f"JSONL: one object per line with 'problem' (or 'question') and 'answer'; at most {MAX_DATASET_BYTES // (1024 * 1024)} MiB.")


class RegisterForm(forms.Form):
    name = forms.CharField(max_length=80, help_text=NAME_RULE)
    path = forms.CharField(max_length=1000, help_text="A JSONL file the operator put under a data root (INFLIGHT_DATA_ROOTS).")


def _page(request: HttpRequest, upload: UploadForm, register: RegisterForm, status: int = 200) -> HttpResponse:
    from inflight.runs.run_paths import _shown

    return render(request, "inflight/datasets.html", {
        "datasets": Dataset.objects.filter(owner=request.user), "upload": upload, "register": register,
        "data_roots": _shown(list(settings.INFLIGHT_DATA_ROOTS)), "max_mib": MAX_DATASET_BYTES // (1024 * 1024),
    }, status=status)


def _stored(request: HttpRequest, dataset: Dataset) -> HttpResponse:
    messages.success(request, f"Dataset '{dataset.name}' stored: {dataset.rows} problems. Use it as task.train_path or task.eval_path: {dataset.path}")
    return redirect("datasets:list")


@login_required
def dataset_list(request: HttpRequest) -> HttpResponse:
    upload, register = UploadForm(prefix="upload"), RegisterForm(prefix="register")
    if request.method == "POST":
        form: forms.Form
        if request.POST.get("action") == "register":
            form = register = RegisterForm(request.POST, prefix="register")
        else:
            form = upload = UploadForm(request.POST, request.FILES, prefix="upload")
        if form.is_valid():
            try:
                if form is register:
                    dataset = storage.register_path(request.user, form.cleaned_data["name"], form.cleaned_data["path"])
                else:
                    dataset = storage.store_upload(request.user, form.cleaned_data["name"], form.cleaned_data["file"])
                return _stored(request, dataset)
            except storage.DatasetRefused as exc:
                for problem in exc.problems:  # a bad file: each bad line, named by its number
                    form.add_error(exc.field if exc.field in form.fields else None, problem)
        return _page(request, upload, register, status=400)
    return _page(request, upload, register)


@login_required
@require_POST
def dataset_delete(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = Dataset.objects.filter(owner=request.user, pk=dataset_id).first()
    if dataset is None:
        raise Http404("no such dataset of yours")
    storage.delete_dataset(dataset)
    messages.success(request, f"Dataset '{dataset.name}' deleted.")
    return redirect("datasets:list")
