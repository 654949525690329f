"""Imported first by a run's fork server (role_forks.WARM_MODULES), before torch: the fork server
sees no GPU, so nothing it imports can initialise CUDA, which a forked role could then not use.
Roles that get a GPU are never forked (role_forks.RoleForks.can_fork); each forked role gets its
own environment back before it runs."""

from __future__ import annotations

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""
