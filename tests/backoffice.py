"""Pressing the admin's action buttons as staff do: open the action's form, then
apply it (as often, and from as many threads, as a test likes)."""

import html
import re
from typing import Any

from django.test import Client

TOKEN = re.compile(r'name="token" value="([0-9a-f]{32})"')


def staff(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def open_action(client: Client, changelist: str, action: str, ids: list[int]):
    """The action's page (its form), as the changelist's Go button leads to it: a
    303 to a URL that names the selection and a fresh one-time token."""
    response = client.post(
        changelist, {"action": action, "_selected_action": ids}, follow=True
    )
    assert response.redirect_chain, response.status_code
    assert response.redirect_chain[0][1] == 303
    return response


def token_of(page) -> str:
    match = TOKEN.search(page.content.decode())
    assert match, page.content.decode()[:2000]
    return match.group(1)


def action_url(changelist: str, action: str, ids: list[int]) -> str:
    return f"{changelist}backoffice/{action}/?ids={','.join(map(str, ids))}"


def apply_action(
    client: Client, changelist: str, action: str, ids: list[int], **fields: Any
):
    """Submit the action's form; follows the 303 back to the list."""
    return client.post(action_url(changelist, action, ids), fields, follow=True)


MESSAGE = re.compile(r'<li class="(?:success|info|warning|error)">(.*?)</li>', re.S)


def messages_of(response) -> list[str]:
    """The messages the page showed, read from the page itself (a response's
    `context` is not to be trusted when other threads render templates too)."""
    return [
        html.unescape(m).strip() for m in MESSAGE.findall(response.content.decode())
    ]
