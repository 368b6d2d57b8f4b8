"""Revoking an API token reaches the Redis replay shortcut at once.

The replay middleware answers a retry from Redis before anyone authenticates it (see
`fastpath.begin_for_credential`), so a token that may no longer authenticate must lose
its entry there the moment it goes: deleted (a rotation deletes the old token, a
deleted user's tokens go with it) or its user deactivated. The entry is replaced even
before the deletion commits: a request the token sends meanwhile still authenticates
through the database, only without the shortcut (and so does a token whose deletion
rolled back, for `fastpath.REVOKED_MS`: slower, never wrong).
"""

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from rest_framework.authtoken.models import Token

from .fastpath import credential_revoke


# (DRF's admin deletes through its `TokenProxy`, which deletes the `Token` rows.)
@receiver(post_delete, sender=Token, dispatch_uid="idempotency.token_deleted")
def token_deleted(sender: type[Token], instance: Token, **kwargs: Any) -> None:
    credential_revoke(f"Token {instance.key}")


@receiver(post_save, sender=get_user_model(), dispatch_uid="idempotency.user_saved")
def user_saved(sender: type, instance: Any, **kwargs: Any) -> None:
    if instance.is_active:
        return
    for key in Token.objects.filter(user_id=instance.pk).values_list("key", flat=True):
        credential_revoke(f"Token {key}")
