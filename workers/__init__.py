"""Celery app and tasks that run rl_core on worker nodes and report back to the platform."""
