"""The settings `make run` serves with (ledger.settings: DEBUG off unless
DJANGO_DEBUG says otherwise), with views that fail (tests/ledger/error_urls.py)."""

from ledger.settings import *  # noqa: F403

ROOT_URLCONF = "tests.ledger.error_urls"
