"""Dataset pages, included at / by the root urlconf."""

from __future__ import annotations

from django.urls import path

from inflight.datasets import views

app_name = "datasets"

urlpatterns = [
    path("datasets/", views.dataset_list, name="list"),
    path("datasets/<int:dataset_id>/delete/", views.dataset_delete, name="delete"),
]
