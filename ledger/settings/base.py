"""Settings for the idempotent ledger.

Every environment variable the app reads is read here, once. With no variables set the
app runs on embedded defaults: a SQLite file, no Redis and a Celery broker that keeps
its queue in files, so `make run` works on a bare machine. `DATABASE_URL`, `REDIS_URL`
and `CELERY_BROKER_URL` switch it to PostgreSQL, Redis and a real broker.
"""

import contextlib
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(
    name: str, default: int, minimum: int | None = None, maximum: int | None = None
) -> int:
    """The whole number a variable names; a typo, or a number below `minimum`,
    above `maximum` or outside `minimum..maximum`, stops the process with one line
    naming the variable and what it takes (`manage.py` prints ImproperlyConfigured
    so), not with a traceback from int() or the system checks' report (which still
    guard values set in code)."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a whole number: leave it unset for {default}"
        ) from None
    if minimum is not None and maximum is not None:
        if not minimum <= number <= maximum:
            raise ImproperlyConfigured(
                f"{name}={value!r} is outside {minimum}..{maximum}: give a whole "
                f"number from {minimum} to {maximum}, or leave it unset for {default}"
            )
    elif minimum is not None and number < minimum:
        raise ImproperlyConfigured(
            f"{name}={value!r} is below {minimum}: give a whole number of at least "
            f"{minimum}, or leave it unset for {default}"
        )
    elif maximum is not None and number > maximum:
        raise ImproperlyConfigured(
            f"{name}={value!r} is above {maximum}: give a whole number of at most "
            f"{maximum}, or leave it unset for {default}"
        )
    return number


# Runtime files of the embedded mode (SQLite database, file broker, demo credentials).
DATA_DIR = Path(env("LEDGER_DATA_DIR", str(BASE_DIR / ".var")))
# Made here when possible; `manage.py serve` names a folder that cannot be made.
with contextlib.suppress(OSError):
    DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env("DJANGO_SECRET_KEY", "dev-only-insecure-secret-key-change-me")
# The keys DJANGO_SECRET_KEY replaced, comma-separated: what they signed (sessions,
# the back office's one-time form tokens) stays valid while they are listed here.
SECRET_KEY_FALLBACKS = [
    k.strip() for k in env("DJANGO_SECRET_KEY_FALLBACKS").split(",") if k.strip()
]
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver"
).split(",")
CSRF_TRUSTED_ORIGINS = [o for o in env("DJANGO_CSRF_TRUSTED_ORIGINS").split(",") if o]
# A stale form gets a page in the shop's layout (an API path: problem+json).
CSRF_FAILURE_VIEW = "ledger.problems.csrf_failure"

INSTALLED_APPS = [
    "ledger.apps.AdminConfig",  # Django's admin on the back office's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "ledger",
    "idempotency",
    "orders",
    "payments",
]

MIDDLEWARE = [
    # First: no NUL in a URL, no body over DATA_UPLOAD_MAX_MEMORY_SIZE (404, 413).
    "ledger.middleware.RequestLimitsMiddleware",
    # Outside the replay shortcut: a replay carries the security headers the
    # answer it replays did (nosniff, referrer and opener policies, frame denial).
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A retry of a finished request is answered from Redis in one round trip.
    "idempotency.middleware.ReplayMiddleware",
    # Health, readiness and metrics, whatever the Host header says: after the
    # security headers (which do not read the host), before CommonMiddleware.
    "ledger.middleware.ProbeMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    # The API answers in English, whatever Accept-Language says.
    "ledger.middleware.ApiLanguageMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

# The largest request body the app reads, as nginx's `client_max_body_size 1m`;
# a larger one is a 413 (ledger.middleware.RequestLimitsMiddleware).
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

ROOT_URLCONF = "ledger.urls"
WSGI_APPLICATION = "ledger.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
            ],
        },
    },
]


def database_from_url(url: str) -> dict[str, Any]:
    """Build a DATABASES entry; SQLite gets WAL and immediate transactions.

    In WAL mode readers never block the writer, and `BEGIN IMMEDIATE` takes the write
    lock when a transaction starts, so a second writer waits (up to `timeout`) instead
    of failing half-way with "database is locked".
    """
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url))
    except ValueError as exc:  # an unknown scheme, a port that is no number
        problem = (
            f"has an unknown scheme {url.partition('://')[0]!r}"
            if isinstance(exc, dj_database_url.UnknownSchemeError)
            else f"cannot be read ({exc})"
        )
        raise ImproperlyConfigured(
            f"DATABASE_URL {problem}: use postgres://USER@HOST:5432/NAME, "
            "or leave it unset for the SQLite file"
        ) from exc
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": (
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                "PRAGMA busy_timeout=30000;"
            ),
        }
    else:
        config["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60)
        config["CONN_HEALTH_CHECKS"] = True
    return config


# Set but empty (`DATABASE_URL=` in a .env) is unset, as for the broker below.
DATABASE_URL = env("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'ledger.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL")
# REDIS_URL names one node of a Redis Cluster (database 0), not a single Redis.
REDIS_CLUSTER = env_bool("REDIS_CLUSTER")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "order-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's, made safe for hostile input: the parser bounds nesting, the renderer
    # cannot fail on a lone surrogate it echoes.
    "DEFAULT_RENDERER_CLASSES": ["ledger.renderers.JSONRenderer"],
    # An Accept of only application/problem+json is answered in JSON, not 406.
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "ledger.renderers.ContentNegotiation",
    "DEFAULT_PARSER_CLASSES": ["ledger.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "ledger.problems.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Idempotent ledger API",
    "DESCRIPTION": "Orders, payments and a ledger where every write happens once.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ loads Swagger UI from our own static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
}

# The default currency of wallets and orders (ISO 4217); money is in minor units.
LEDGER_DEFAULT_CURRENCY = env("LEDGER_DEFAULT_CURRENCY", "CNY")
# Spread payments to the merchant over this many sub-accounts (0: credit the
# merchant's own account): each payment holds one row lock to the end of its
# transaction, so one hot merchant takes payments one at a time without them.
# (0..1024: ledger.checks' MERCHANT_SUB_ACCOUNTS_MAX.)
MERCHANT_SUB_ACCOUNTS = env_int("MERCHANT_SUB_ACCOUNTS", 0, minimum=0, maximum=1024)

# Idempotency engine.
IDEMPOTENCY_TTL_SECONDS = env_int("IDEMPOTENCY_TTL_SECONDS", 86400, minimum=1)
IDEMPOTENCY_LEASE_SECONDS = env_int("IDEMPOTENCY_LEASE_SECONDS", 30, minimum=1)
# What to do when Redis is configured but unreachable: "database" falls back to the
# database path (still exactly once), "refuse" answers 503.
IDEMPOTENCY_REDIS_FAILURE = env("IDEMPOTENCY_REDIS_FAILURE", "database")
IDEMPOTENCY_REPLAY_CACHE_SECONDS = env_int(
    "IDEMPOTENCY_REPLAY_CACHE_SECONDS", 3600, minimum=0
)
# Per endpoint name: "required" (default), "optional" (no key: run without the layer)
# or "off".
IDEMPOTENCY_ENDPOINTS: dict[str, str] = {}

PAYMENT_PROVIDER_SECRET = env("PAYMENT_PROVIDER_SECRET", "dev-provider-secret")

# Celery: money work wants late acknowledgement (a task whose worker died is delivered
# again), one message prefetched at a time and hard time limits.
CELERY_BROKER_URL = env("CELERY_BROKER_URL") or "filesystem://"
# kombu's filesystem transport takes its folders from these options only, whatever
# else the URL says.
if CELERY_BROKER_URL.partition("://")[0] == "filesystem":
    # The rest of the URL means nothing to kombu, but a URL that names no host makes
    # it warn "No hostname was supplied" in every process that connects.
    CELERY_BROKER_URL = "filesystem://localhost/"
    _broker_dir = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        # Broadcast exchanges (celery inspect, the worker's pidbox); by default a
        # "control" folder wherever the process runs.
        "control_folder": str(_broker_dir / "control"),
    }
    # kombu needs the folders to exist; `manage.py serve` says so clearly if they
    # cannot be made.
    for _folder in ("queue", "processed", "control"):
        with contextlib.suppress(OSError):
            (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
elif CELERY_BROKER_URL.partition(":")[0] in {"amqp", "amqps", "pyamqp"}:
    # RabbitMQ, as money work wants it (ledger/broker.py says why, line by line):
    # replicated quorum queues with per-consumer prefetch, countdowns and retries by
    # the broker's native delayed delivery, and a delivery limit past which a message
    # that kills its worker every time moves to the dead-letter queue `celery.dead`.
    from ledger.broker import rabbitmq_queues, rabbitmq_transport_options

    CELERY_DELIVERY_LIMIT = env_int("CELERY_DELIVERY_LIMIT", 10)
    CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"
    CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"
    CELERY_TASK_QUEUES = rabbitmq_queues(delivery_limit=CELERY_DELIVERY_LIMIT)
    CELERY_BROKER_NATIVE_DELAYED_DELIVERY_QUEUE_TYPE = "quorum"
    # The broker confirms every task it accepts, and every wait on its socket is
    # bounded (5 s), as on Redis: a broker that never answers is an error in beat's
    # log, not a hang.
    CELERY_BROKER_TRANSPORT_OPTIONS = rabbitmq_transport_options()
else:
    # Longer than any countdown or eta we use, or Redis would hand a delayed task to a
    # second worker while the first one still waits to run it (ledger/broker.py; the
    # README's "Operations" says what it costs when an acknowledgement is lost). Every
    # socket wait is bounded, so a broker that never answers is an error in beat's
    # log, not a hang.
    from ledger.broker import REDIS_VISIBILITY_TIMEOUT_SECONDS, redis_transport_options

    CELERY_BROKER_TRANSPORT_OPTIONS = redis_transport_options(
        visibility_timeout=REDIS_VISIBILITY_TIMEOUT_SECONDS
    )
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 120
CELERY_TASK_SOFT_TIME_LIMIT = 100
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A web request sends its tasks after its commit and waits on the broker this long a
# step at most; after a failure its process sends none for CELERY_PUBLISH_BREAK_SECONDS
# and leaves them to beat's re-drive (ledger/publishing.py).
CELERY_PUBLISH_TIMEOUT_SECONDS = float(env("CELERY_PUBLISH_TIMEOUT_SECONDS", "0.25"))
CELERY_PUBLISH_BREAK_SECONDS = float(env("CELERY_PUBLISH_BREAK_SECONDS", "5"))
# django-celery-beat's database scheduler, led: of all the beats running, only the one
# holding the "beat" lease (BEAT_LEASE_SECONDS, by the database's clock) sends tasks.
CELERY_BEAT_SCHEDULER = "ledger.beat:LeaderScheduler"
BEAT_LEASE_SECONDS = env_int("BEAT_LEASE_SECONDS", 30, minimum=1)
# The longest one try of beat's send can take: connecting, then the broker's answers
# to the connection's set-up, its ping and the send, each bounded on Redis by a 5 s
# socket timeout (ledger/broker.py). The leader starts a try only while its lease has
# this and a tenth of the lease left (ledger/beat.py): so it stays under 9/10 of it.
BEAT_PUBLISH_TRY_SECONDS = float(env("BEAT_PUBLISH_TRY_SECONDS", "20"))
CELERY_BEAT_SCHEDULE = {
    # Every five minutes: a run lasts at most 60 s (resting ten times as long
    # as it works, to keep out of the writers' way), a fifth of a million keys or so.
    "idempotency-purge-expired": {
        "task": "idempotency.tasks.purge_expired_keys",
        "schedule": 300.0,
    },
    "idempotency-release-stuck": {
        "task": "idempotency.tasks.release_stuck_keys",
        "schedule": 60.0,
    },
    "idempotency-complete-stuck": {
        "task": "idempotency.tasks.complete_stuck_keys",
        "schedule": 60.0,
    },
    # The journal's hash chain: entries committed since the last run get their seal.
    "ledger-seal-journal": {
        "task": "ledger.tasks.seal_journal",
        "schedule": 60.0,
    },
    # Merchant sub-accounts (MERCHANT_SUB_ACCOUNTS) swept into their merchant.
    "ledger-sweep-merchant-sub-accounts": {
        "task": "ledger.tasks.sweep_merchant_sub_accounts",
        "schedule": 60.0,
    },
    "ledger-check-invariants": {
        "task": "ledger.tasks.check_invariants",
        "schedule": 600.0,
    },
}
CELERY_TIMEZONE = "UTC"

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# Orders: how long each process's lease on its Snowflake worker id lasts (leased from
# the database, renewed every third of it; a process that cannot renew in time stops
# issuing numbers) and how long a pre-order's number stays usable.
SNOWFLAKE_LEASE_SECONDS = env_int("SNOWFLAKE_LEASE_SECONDS", 30, minimum=1)
PREORDER_TTL_SECONDS = env_int("PREORDER_TTL_SECONDS", 3600, minimum=1)
# An unused pre-order is deleted this long after it expired (until then a late request
# hears "expired" rather than "unknown"); at least orders.services'
# PREORDER_PURGE_MIN_GRACE_SECONDS (the system check orders.E001 holds the two
# together).
PREORDER_PURGE_AFTER_SECONDS = env_int(
    "PREORDER_PURGE_AFTER_SECONDS", 86400, minimum=600
)
CELERY_BEAT_SCHEDULE["orders-purge-expired-preorders"] = {
    "task": "orders.tasks.purge_expired_preorders",
    "schedule": 3600.0,
}

# Payments through the provider. Our side: where the provider (by default the bundled
# simulator under /provider/: `make run` serves it from a process of its own and sets
# this, see ledger/management/commands/serve.py) is reached, how long a provider
# payment may stay pending before beat asks the provider for its status, and how long
# an order may stay unpaid before beat cancels it.
_PORT = env("PORT", "8000")
PAYMENT_PROVIDER_URL = env("PAYMENT_PROVIDER_URL", f"http://127.0.0.1:{_PORT}/provider")
PAYMENT_PROVIDER_TIMEOUT_SECONDS = float(env("PAYMENT_PROVIDER_TIMEOUT_SECONDS", "10"))
PAYMENT_PENDING_TIMEOUT_SECONDS = env_int(
    "PAYMENT_PENDING_TIMEOUT_SECONDS", 600, minimum=1
)
# A provider callback whose processing failed this many times (a business refusal,
# e.g. a frozen merchant account; beat re-drives it every minute) is parked for an
# operator (`manage.py redrive_provider_events`) instead of re-driven for ever.
PROVIDER_EVENT_MAX_ATTEMPTS = env_int("PROVIDER_EVENT_MAX_ATTEMPTS", 10, minimum=1)
# Likewise a provider payment (pending, or settled and reconciled) whose re-drive was
# refused this many times for a business reason (the provider refunded its charge
# and the refund cannot leave a frozen merchant account) is parked for staff, who
# re-drive it from the admin (1..32767: payments.checks' REDRIVE_ATTEMPTS_MAX, the
# column's range).
PAYMENT_REDRIVE_MAX_ATTEMPTS = env_int(
    "PAYMENT_REDRIVE_MAX_ATTEMPTS", 10, minimum=1, maximum=32767
)
ORDER_UNPAID_EXPIRY_SECONDS = env_int("ORDER_UNPAID_EXPIRY_SECONDS", 86400, minimum=1)
# The simulator's side: where it delivers callbacks, its retry schedule (seconds
# between attempts; PROVIDER_RETRY_SCALE shrinks it for tests), how long it dedupes a
# merchant order number, and whether it delivers every callback twice on purpose.
PROVIDER_CALLBACK_URL = env(
    "PROVIDER_CALLBACK_URL", f"http://127.0.0.1:{_PORT}/api/v1/payments/callback"
)
# The pay page's public origin; empty: the origin the charge request came to.
PROVIDER_PUBLIC_URL = env("PROVIDER_PUBLIC_URL")
PROVIDER_RETRY_SCHEDULE = [15, 15, 30, 180, 600, 1200, 1800, 3600, 7200]
PROVIDER_RETRY_SCALE = float(env("PROVIDER_RETRY_SCALE", "1"))
PROVIDER_DEDUPE_WINDOW_SECONDS = env_int("PROVIDER_DEDUPE_WINDOW_SECONDS", 86400)
PROVIDER_DELIVER_TWICE = env_bool("PROVIDER_DELIVER_TWICE", False)

CELERY_BEAT_SCHEDULE["provider-redeliver-lost"] = {
    "task": "payments.provider.tasks.redeliver_lost_notifications",
    "schedule": 60.0,
}
CELERY_BEAT_SCHEDULE["payments-purge-expired-nonces"] = {
    "task": "payments.tasks.purge_expired_nonces",
    "schedule": 600.0,
}

# Operations: the OpenAPI schema documents Idempotency-Key and every problem+json code
# (ledger.openapi).
REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "ledger.openapi.LedgerAutoSchema"
INSTALLED_APPS += ["payments.provider"]

CELERY_BEAT_SCHEDULE["payments-redrive-pending"] = {
    "task": "payments.tasks.redrive_pending_payments",
    "schedule": 60.0,
}
# A charge refunded at the provider (its dashboard, a chargeback) is reported by no
# callback: beat asks the provider about provider payments settled within the last
# PAYMENT_RECONCILE_WINDOW_SECONDS, each at most every
# PAYMENT_RECONCILE_EVERY_SECONDS, up to PAYMENT_RECONCILE_BATCH a run.
PAYMENT_RECONCILE_WINDOW_SECONDS = env_int(
    "PAYMENT_RECONCILE_WINDOW_SECONDS", 2592000, minimum=1
)
PAYMENT_RECONCILE_EVERY_SECONDS = env_int(
    "PAYMENT_RECONCILE_EVERY_SECONDS", 3600, minimum=1
)
PAYMENT_RECONCILE_BATCH = env_int("PAYMENT_RECONCILE_BATCH", 100, minimum=1)
CELERY_BEAT_SCHEDULE["payments-reconcile-settled"] = {
    "task": "payments.tasks.reconcile_settled_payments",
    "schedule": 60.0,
}
CELERY_BEAT_SCHEDULE["orders-cancel-expired"] = {
    "task": "payments.tasks.cancel_expired_orders",
    "schedule": 300.0,
}
# Holds (manual capture): how long an authorization holds the money by default, and
# the beat that releases holds past their expiry. Until it runs, an expired hold still
# counts in `held` (a capture is already refused): every 10 s keeps that window short,
# and each run is one indexed query (active holds by expiry) when nothing expired.
# (60..2592000: what the API takes, payments.services' HOLD_SECONDS_MIN..MAX.)
HOLD_TTL_SECONDS = env_int("HOLD_TTL_SECONDS", 604800, minimum=60, maximum=2592000)
CELERY_BEAT_SCHEDULE["payments-expire-holds"] = {
    "task": "payments.tasks.expire_holds",
    "schedule": 10.0,
}
CELERY_BEAT_SCHEDULE["payments-redrive-inbox"] = {
    "task": "payments.tasks.redrive_inbox",
    "schedule": 60.0,
}

# Operations: with a token set, /metrics answers only `Authorization: Bearer <token>`.
METRICS_TOKEN = env("METRICS_TOKEN")

# Operations: request ids, HTTP metrics and one JSON log line per request and per
# Celery task (ledger.middleware, ledger.metrics, ledger.logging).
MIDDLEWARE.insert(0, "ledger.middleware.RequestLogMiddleware")
LOGGING["formatters"] = {"json": {"()": "ledger.logging.JsonFormatter"}}
LOGGING["handlers"]["console"]["formatter"] = "json"
LOGGING["loggers"].update(
    {
        # Their own handler: Celery's worker takes over the root logger.
        name: {"handlers": ["console"], "level": "INFO", "propagate": False}
        for name in ("ledger.requests", "ledger.tasks")
    }
)

# Operations: the schema covers our API only, not the bundled provider simulator.
SPECTACULAR_SETTINGS["PREPROCESSING_HOOKS"] = ["ledger.openapi.only_our_api"]
