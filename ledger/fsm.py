"""Re-reading a protected state field from the database, safely in any thread.

A status declared `protected=True` refuses any assignment once an instance holds it,
so that only transitions move it; Django's `refresh_from_db` assigns it, and so
fails. django-fsm's `FSMModelMixin` (under `ConcurrentTransitionMixin`) lets a
refresh through by switching `protected` off on the field and on again afterwards,
but the field is one object that every instance of the model shares in the
process: two refreshes in two threads (gunicorn's gthread workers, a test's
threads) overlap, the first to finish switches the protection back on under the
second, and the second fails with "Direct status modification is not allowed" (an
admin action's 500). Meanwhile any thread could assign the status by hand.

`ProtectedStateMixin` lifts the protection for the one instance being refreshed
and no other: the field's descriptor refuses only an assignment over a state the
instance already holds, so the refresh sets the held state aside and loads it
anew. The field stays protected for everyone else throughout.
"""

from typing import Any

from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMFieldMixin


class ProtectedStateMixin(models.Model):
    """Put first among the bases of a model with a protected FSM field (before
    `ConcurrentTransitionMixin`, whose refresh it replaces)."""

    class Meta:
        abstract = True

    def refresh_from_db(
        self,
        using: str | None = None,
        fields: Any = None,
        from_queryset: Any = None,
    ) -> None:
        held_names = self._held_protected_states()
        asked = held_names if fields is None else held_names & set(fields)
        # Every held state is set aside, asked for or not: Django may copy one it was
        # not asked for (the row it loads reads its state as it is built), and the
        # field would refuse it. One not asked for gets what it held back.
        held = {name: self.__dict__.pop(name) for name in held_names}
        # Set aside, the states would look deferred: not deferred, only reloading.
        self._reloading_states = frozenset(held)
        try:
            # Django's own refresh, not django-fsm's, which flips the shared field.
            models.Model.refresh_from_db(
                self, using=using, fields=fields, from_queryset=from_queryset
            )
        except BaseException:
            for name, value in held.items():  # the row is gone: keep what we had
                self.__dict__.setdefault(name, value)
            raise
        finally:
            del self._reloading_states
        for name in held_names - asked:
            self.__dict__[name] = held[name]
        if asked and isinstance(self, ConcurrentTransitionMixin):
            # Its next save is conditional on the state just read, not the old one.
            self._update_initial_state()

    def get_deferred_fields(self) -> set[str]:
        reloading = self.__dict__.get("_reloading_states", frozenset())
        return super().get_deferred_fields() - reloading

    def _held_protected_states(self) -> set[str]:
        return {
            field.attname
            for field in self._meta.concrete_fields
            if isinstance(field, FSMFieldMixin)
            and field.protected
            and field.attname in self.__dict__
        }
