"""Django settings, all from environment variables with safe defaults for the embedded mode.

Importing this module never touches a service: the defaults point at the embedded
PostgreSQL and Redis that `inflight.devservices` starts under `var/services/`
(fixed local ports), and `docker-compose.yml` sets the same variables for containers.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

# platform/inflight/settings.py -> repo root is two levels above platform/.
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
BASE_DIR = REPO_ROOT


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Ports of the embedded services started by `inflight.devservices` (make demo).
EMBEDDED_POSTGRES_PORT = int(os.environ.get("INFLIGHT_PG_PORT", "55432"))
EMBEDDED_REDIS_PORT = int(os.environ.get("INFLIGHT_REDIS_PORT", "56379"))

DEBUG = _env_bool("DEBUG", True)
# The default key is only for the local embedded demo; docker-compose and any real
# deployment must set SECRET_KEY (DEBUG=0 without one refuses to start).
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "inflight-local-demo-key-not-for-production"
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves HTTP and WebSockets (ASGI)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "inflight.accounts",
    "inflight.runs",
    "inflight.api",
    "inflight.web",
    "inflight.live",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "inflight.urls"
WSGI_APPLICATION = "inflight.wsgi.application"
ASGI_APPLICATION = "inflight.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [REPO_ROOT / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get(
    "DATABASE_URL", f"postgres://postgres@127.0.0.1:{EMBEDDED_POSTGRES_PORT}/inflight"
)
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}

REDIS_URL = os.environ.get("REDIS_URL", f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
    }
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-run does not silently drop the message
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one long run per slot; never hoard queued runs
CELERY_TASK_DEFAULT_QUEUE = "cpu"
# Beyond this age a worker's heartbeat counts as stopped and its runs become `lost`.
INFLIGHT_HEARTBEAT_INTERVAL_S = float(os.environ.get("INFLIGHT_HEARTBEAT_INTERVAL_S", "5"))
INFLIGHT_WORKER_LOST_AFTER_S = float(os.environ.get("INFLIGHT_WORKER_LOST_AFTER_S", "30"))

# Where run directories live (`<runs dir>/<run id>/`); relative paths are under the repo root.
INFLIGHT_RUNS_DIR = Path(os.environ.get("INFLIGHT_RUNS_DIR", "var/runs"))
if not INFLIGHT_RUNS_DIR.is_absolute():
    INFLIGHT_RUNS_DIR = REPO_ROOT / INFLIGHT_RUNS_DIR
# Python that runs `-m rl_core run` on workers (default: the worker's own interpreter).
INFLIGHT_RL_PYTHON = os.environ.get("INFLIGHT_RL_PYTHON", "")

# Command prefix that runs the engine (`run CONFIG --out DIR` is appended); default
# `<INFLIGHT_RL_PYTHON> -m rl_core`. E.g. `nice -n 5 python -m rl_core`.
INFLIGHT_RL_COMMAND = os.environ.get("INFLIGHT_RL_COMMAND", "")
# How often the worker tails the run directory (also the coalescing window of live pushes).
INFLIGHT_POLL_S = float(os.environ.get("INFLIGHT_POLL_S", "0.25"))
# SIGTERM → SIGKILL grace period when a run is cancelled.
INFLIGHT_CANCEL_TIMEOUT_S = float(os.environ.get("INFLIGHT_CANCEL_TIMEOUT_S", "20"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True


def _plotly_package_data_dir() -> Path | None:
    # plotly.js ships inside the `plotly` Python package: served locally, no CDN.
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "package_data"
    return folder if (folder / "plotly.min.js").is_file() else None


STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", REPO_ROOT / "staticfiles"))
STATICFILES_DIRS: list = [REPO_ROOT / "static"]
_PLOTLY_DIR = _plotly_package_data_dir()
if _PLOTLY_DIR is not None:
    STATICFILES_DIRS.append(("vendor/plotly", _PLOTLY_DIR))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
