from __future__ import annotations

from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "inflight.rollouts"
    label = "rollouts"
    verbose_name = "Stored rollouts (the rollout viewer)"
