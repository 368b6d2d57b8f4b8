"""The authenticated caller, typed for services that take a user; and how an API
token is named where people read it."""

from typing import cast

from django.contrib.auth.models import User
from django.http import HttpRequest
from rest_framework.request import Request


def authenticated(request: HttpRequest | Request) -> User:
    """The caller of a view that only users reach (DRF's default IsAuthenticated,
    or `login_required`). Narrows the type; checks nothing at run time."""
    return cast(User, request.user)


# How many characters of an API token are shown: enough to tell a customer's token
# from another's, far too few to use.
TOKEN_SHOWN = 6


def token_prefix(key: str | None) -> str:
    """`7721a0…` for the token `7721a0bf69d4...`: how a token is named to people."""
    return f"{key[:TOKEN_SHOWN]}…" if key else "—"
