"""A user's own dataset: a JSONL file of problems and answers a run may train or evaluate on
(`task.train_path` / `task.eval_path`), uploaded into the user's folder of the datasets root
(`roots.user_folder`) or registered by its path under an operator's data root. Only its owner
sees it, and only its owner's runs may read an uploaded one (`runs.run_paths`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class DatasetSource(models.TextChoices):
    UPLOADED = "uploaded", "Uploaded"
    REGISTERED = "registered", "Registered by path"


class Dataset(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=80, help_text="Unique among the owner's datasets: letters, digits, '_', '-', '.'.")
    source = models.CharField(max_length=12, choices=DatasetSource.choices)
    path = models.CharField(max_length=1000, help_text="Absolute path of the JSONL file, as a run config names it.")
    rows = models.IntegerField(help_text="Problems in the file (blank lines not counted).")
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, help_text="Digest of the file when it was checked.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="dataset_owner_name")]

    def __str__(self) -> str:
        return f"{self.owner} / {self.name}"
