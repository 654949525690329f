"""Django settings, all from environment variables with safe defaults for the embedded mode.

Importing this module never touches a service: the defaults point at the embedded
PostgreSQL and Redis that `inflight.devservices` starts under `var/services/`
(fixed local ports), and `docker-compose.yml` sets the same variables for containers.
"""

from __future__ import annotations

import os
import secrets
import sys
from datetime import timedelta
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


# How often the web node hands the GIL to a waiting thread (inflight/asgi.py says why).
INFLIGHT_GIL_SWITCH_S = float(os.environ.get("INFLIGHT_GIL_SWITCH_S", "0.0005"))


# Ports of the embedded services started by `inflight.devservices` (make demo).
EMBEDDED_POSTGRES_PORT = int(os.environ.get("INFLIGHT_PG_PORT", "55432"))
EMBEDDED_REDIS_PORT = int(os.environ.get("INFLIGHT_REDIS_PORT", "56379"))

# Off unless set: a debug page shows settings (database and broker URLs) and every route.
# `make demo` and the tests set what they need explicitly.
DEBUG = _env_bool("DEBUG", False)
# Values that must never sign sessions in a deployment (the old compose default among them).
PLACEHOLDER_SECRET_KEYS = frozenset({"change-me-in-production", "changeme", "secret", "inflight-local-demo-key-not-for-production"})
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if SECRET_KEY in PLACEHOLDER_SECRET_KEYS and not DEBUG:
    raise RuntimeError("SECRET_KEY is a placeholder value: set a long random one (python -c 'import secrets; print(secrets.token_urlsafe(50))')")
# True when no SECRET_KEY was given: the web entry points (asgi.py, wsgi.py) refuse to serve with
# DEBUG off, while management commands, Celery workers and tests (which sign nothing that must
# outlive the process) get a random key of their own.
SECRET_KEY_MISSING = not SECRET_KEY
if not SECRET_KEY:
    SECRET_KEY = "inflight-local-demo-key-not-for-production" if DEBUG else secrets.token_urlsafe(50)


ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

# HTTPS. Cookies are Secure with DEBUG off (INFLIGHT_SECURE_COOKIES=0 for plain-HTTP localhost,
# as `make demo` does). TLS itself belongs to the reverse proxy in front (README "Deploying for
# several users"); the HTTPS redirect and HSTS come from the environment: docker-compose.yml turns
# them on (so `check --deploy` is clean there), the plain-HTTP demo leaves them off.
SECURE_COOKIES = _env_bool("INFLIGHT_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
# A refused POST to a JSON endpoint answers JSON (`{"error": ...}`), a page the site's error page.
CSRF_FAILURE_VIEW = "inflight.web.views.csrf_failure"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
# The `preload` directive only allows a submission to the browsers' preload list: the operator's call.
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", False)
if _env_bool("INFLIGHT_TRUST_X_FORWARDED_PROTO", False):
    # Only behind a proxy that sets this header itself (a client could forge it otherwise).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# The pages load only their own scripts and styles (plotly draws with inline style attributes).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)

# Request bodies: larger ones answer 413 before anything reads them (a run config is a few KB).
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("INFLIGHT_MAX_BODY_BYTES", str(1024 * 1024)))
DATA_UPLOAD_MAX_NUMBER_FIELDS = 2000

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
    "inflight.rollouts",
    "inflight.alerts",
    "inflight.inbox",
    "inflight.datasets",
    "inflight.provenance",
    "axes",
    "ninja",  # the API's OpenAPI schema and docs page (api/schema.py); listed so its vendored Swagger UI is served, no CDN
]

MIDDLEWARE = [
    "inflight.web.middleware.InputGuardMiddleware",
    "inflight.web.middleware.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "inflight.web.middleware.ContentSecurityPolicyMiddleware",
    "inflight.web.middleware.ApiErrorShapeMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it answers a locked-out sign-in.
    "axes.middleware.AxesMiddleware",
]

# Login throttling (django-axes): after INFLIGHT_LOGIN_FAILURE_LIMIT failed sign-ins for one
# username from one address, that pair is refused (429) for INFLIGHT_LOGIN_COOLOFF_MIN minutes.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("INFLIGHT_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("INFLIGHT_LOGIN_COOLOFF_MIN", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

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
                "inflight.inbox.context_processors.inbox",
                "inflight.runs.context_processors.run_statuses",
                "inflight.runs.context_processors.metric_names",
            ],
        },
    },
]

DATABASE_URL = os.environ.get(
    "DATABASE_URL", f"postgres://postgres@127.0.0.1:{EMBEDDED_POSTGRES_PORT}/inflight"
)
# Persistent connections (health-checked before reuse): opening a PostgreSQL connection per call (a
# backend fork each, its catalog caches cold) held up 125 pages opening at once past Daphne's 5 s
# handshake limit (bench/platform_scale.py). A worker's supervisor and writer threads keep theirs.
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=int(os.environ.get("INFLIGHT_DB_CONN_MAX_AGE", "60")), conn_health_checks=True)}
# The web node (inflight/asgi.py, which Daphne imports before these settings) takes its connections
# from a pool (psycopg_pool): Django runs each page request on a thread of its own, so a connection
# kept per thread was still a new backend per request, a sixth of PostgreSQL's CPU at 200 live runs
# and 500 open pages (bench/platform_scale.py). Workers do not: a pooled connection is waited for
# during an outage (5 s) and reopened with a growing back-off after it, and a worker back from one
# must write its heartbeat at once (tests/platform/test_faults.py).
WEB_NODE = "inflight.asgi" in sys.modules
if WEB_NODE and _env_bool("INFLIGHT_DB_POOL", True):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them (CONN_HEALTH_CHECKS: checked when taken)
    # INFLIGHT_DB_POOL_MAX is the node's: a web node's processes (inflight/web/node.py tells each how
    # many there are) split it, so a node holds as many PostgreSQL connections however many cores it uses.
    _web_processes = max(1, int(os.environ.get("INFLIGHT_WEB_PROCESSES") or 1))
    _pool_max = max(4, int(os.environ.get("INFLIGHT_DB_POOL_MAX", "32")) // _web_processes)
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": _pool_max, "timeout": 5}

REDIS_URL = os.environ.get("REDIS_URL", f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0")
# Live pushes go through Redis pub/sub: a push is one PUBLISH per run group, and each web node
# receives it once (on one subscribed connection) and hands it to its pages in memory. The list
# layer (channels_redis.core, INFLIGHT_CHANNEL_LAYER=redis) costs each web node four Redis round
# trips per page per push, one after another: at 100 live runs x 250 pages on a busy 2-core machine
# its queue backed up for seconds whenever the runs' kept rollouts arrived (push p95 2.7 s vs 0.3 s
# here, bench/platform_scale.py), and at 200 runs its 30 s expiry dropped pushes. Pub/sub keeps
# nothing for a page that is not connected: the page refetches its snapshot on (re)connecting and
# on any seq gap, so nothing is lost to it either way.
_REDIS_HOST = {"address": REDIS_URL, "socket_timeout": 15, "socket_connect_timeout": 5}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [_REDIS_HOST]}}}
if os.environ.get("INFLIGHT_CHANNEL_LAYER", "pubsub") == "redis":
    CHANNEL_LAYERS["default"] = {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # socket_timeout above channels_redis's 5 s blocking read (BZPOPMIN): redis-py 8's default
        # is also 5 s, so an idle page's consumer timed out reading just as Redis answered "nothing
        # yet", crashed and dropped the socket with 1011 (bench/platform_scale.py found it).
        "CONFIG": {"hosts": [_REDIS_HOST], "capacity": 1000, "expiry": 30},
    }

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-run does not silently drop the message
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one long run per slot; never hoard queued runs
CELERY_TASK_DEFAULT_QUEUE = "cpu"
# Beyond this age a worker's heartbeat counts as stopped and its runs become `lost`.
INFLIGHT_HEARTBEAT_INTERVAL_S = float(os.environ.get("INFLIGHT_HEARTBEAT_INTERVAL_S", "5"))
INFLIGHT_WORKER_LOST_AFTER_S = float(os.environ.get("INFLIGHT_WORKER_LOST_AFTER_S", "30"))
# A run `queued` this long whose message is in no broker queue (a broker restart lost it) is sent again.
INFLIGHT_REQUEUE_AFTER_S = float(os.environ.get("INFLIGHT_REQUEUE_AFTER_S", "30"))

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
# Alert webhooks (the URL each user sets): the operator can switch all of them off.
INFLIGHT_ALERT_WEBHOOKS = os.environ.get("INFLIGHT_ALERT_WEBHOOKS", "1").lower() not in ("0", "false", "no", "off")
# SIGTERM → SIGKILL grace period when a run is cancelled.
INFLIGHT_CANCEL_TIMEOUT_S = float(os.environ.get("INFLIGHT_CANCEL_TIMEOUT_S", "20"))


def _roots(name: str, default: str) -> list[Path]:
    """Comma-separated folders; relative ones are under the repo root (the engine's working directory)."""
    return [Path(os.path.normpath(REPO_ROOT / item)) for item in _env_list(name, default)]


# Where a submitted run may read (rl_core reads these fields as the worker's user; the platform
# checks them at submit time and again on the worker, `inflight.runs.run_paths`):
#   model.path -> under a models root, or a checkpoint of one of the submitter's own runs;
#   task.train_path, task.eval_path, eval.data_dir -> under a data root.
INFLIGHT_MODELS_ROOTS = _roots(
    "INFLIGHT_MODELS_ROOTS", os.path.dirname(os.environ.get("INFLIGHT_TINY_MODEL", "var/models/tiny").rstrip("/")) or "var/models"
)
# Users' uploaded datasets (`inflight.datasets`): `<dir>/<user id>/<name>.jsonl`; a run may read
# only its owner's folder. Relative paths are under the repo root.
INFLIGHT_DATASETS_DIR = Path(os.environ.get("INFLIGHT_DATASETS_DIR", "var/datasets"))
if not INFLIGHT_DATASETS_DIR.is_absolute():
    INFLIGHT_DATASETS_DIR = REPO_ROOT / INFLIGHT_DATASETS_DIR
INFLIGHT_DATA_ROOTS = _roots("INFLIGHT_DATA_ROOTS", os.environ.get("INFLIGHT_SHARED_DATA", "../shared/data"))
# Hugging Face hub ids a run may name as model.path (exact ids, comma-separated; none by default).
INFLIGHT_HUB_MODELS = _env_list("INFLIGHT_HUB_MODELS", "")
# The Redis a `stream.kind: redis` run uses (the platform's choice); unset: only
# `stream.redis_embedded` (a private redis-server in the run directory) is accepted.
INFLIGHT_STREAM_REDIS_URL = os.environ.get("INFLIGHT_STREAM_REDIS_URL", "")

# Resource limits of a submitted run (`inflight.runs.run_limits`); the workers' reported CPUs
# and GPUs bound them further.
INFLIGHT_MAX_ACTIVE_RUNS_PER_USER = int(os.environ.get("INFLIGHT_MAX_ACTIVE_RUNS_PER_USER", "4"))
INFLIGHT_MAX_STEPS = int(os.environ.get("INFLIGHT_MAX_STEPS", "100000"))
INFLIGHT_MAX_WALL_TIME_S = float(os.environ.get("INFLIGHT_MAX_WALL_TIME_S", str(7 * 24 * 3600)))
INFLIGHT_MAX_PROCESSES = int(os.environ.get("INFLIGHT_MAX_PROCESSES", "16"))
INFLIGHT_MAX_THREADS = int(os.environ.get("INFLIGHT_MAX_THREADS", "64"))
# Sequences one run holds at once (a step's samples, requests in flight, a server's batch, one
# held-out evaluation): 16384 is 1024 prompts x 16 attempts, past any published GRPO recipe.
INFLIGHT_MAX_SAMPLES_PER_STEP = int(os.environ.get("INFLIGHT_MAX_SAMPLES_PER_STEP", "16384"))
# Problems a synthetic task generates when the run starts (all held in memory).
INFLIGHT_MAX_TASK_PROBLEMS = int(os.environ.get("INFLIGHT_MAX_TASK_PROBLEMS", "1000000"))

# E-mail (the sign-in page's password reset): printed to the web server's log unless an SMTP
# server is configured, so the form never fails on an SMTP server that is not there.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "inflight@localhost")

# API tokens: stored as SHA-256 digests, valid this many days (0: no expiry).
INFLIGHT_API_TOKEN_DAYS = int(os.environ.get("INFLIGHT_API_TOKEN_DAYS", "90"))

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
    "loggers": {"django.db.backends": {"level": "INFO"}, "axes": {"level": "WARNING"}},
}
