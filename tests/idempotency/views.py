"""Test-only endpoints whose effect is real money: a deposit into the caller's wallet.

Counting journal entries therefore counts executions that took effect.
"""

import threading
import uuid

from django.conf import settings
from django.http import HttpResponse
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.completer import register_resumer
from idempotency.decorators import idempotent
from idempotency.engine import Phases
from idempotency.models import IdempotencyRecord
from ledger.auth import authenticated
from ledger.exceptions import InsufficientFunds
from ledger.models import JournalEntry
from ledger.services import ledger_deposit, wallet_get_or_create

crashed_once: set[str] = set()

# A request's `sleep` ends early once a test of this process sets it (`release`
# in tests/idempotency/conftest.py): a slow request then stays in flight exactly
# as long as the test needs it to, not for a guess at a busy machine's worst case.
released = threading.Event()


def pause(seconds: float) -> None:
    released.wait(seconds)


class DepositInput(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)
    sleep = serializers.FloatField(required=False, default=0)
    fail = serializers.ChoiceField(  # type: ignore[assignment]  # a field, not .fail()
        choices=["refuse", "crash", "crash_once", "throttle", "too_large"],
        required=False,
    )


def _deposit(request: Request, amount: int, reference: str) -> JournalEntry:
    wallet = wallet_get_or_create(
        owner_id=authenticated(request).pk,
        currency=settings.LEDGER_DEFAULT_CURRENCY,
    )
    return ledger_deposit(account_id=wallet.pk, amount=amount, reference=reference)


def _created(entry: JournalEntry, amount: int) -> Response:
    response = Response(
        {"entry_id": entry.pk, "amount": amount},
        status=201,
        headers={"Location": f"/test/deposits/{entry.pk}"},
    )
    # Rendered as the API renders it, also when the completer makes it.
    response.accepted_renderer = JSONRenderer()
    response.accepted_media_type = "application/json"
    response.renderer_context = {}  # type: ignore[attr-defined]
    return response


class DepositApi(APIView):
    @idempotent("test.deposit")
    def post(self, request: Request) -> Response:
        data = DepositInput(data=request.data)
        data.is_valid(raise_exception=True)
        entry = _deposit(request, data.validated_data["amount"], f"t:{uuid.uuid4()}")
        pause(data.validated_data["sleep"])
        fail = data.validated_data.get("fail")
        key = request.headers.get("Idempotency-Key", "")
        if fail == "refuse":
            raise InsufficientFunds()
        if fail == "crash" or (fail == "crash_once" and key not in crashed_once):
            crashed_once.add(key)
            raise RuntimeError("the view crashed")
        if fail == "throttle":
            return Response({"detail": "slow down"}, status=429)
        if fail == "too_large":  # as a body-size limit would answer
            return Response({"detail": "too large"}, status=413)
        return _created(entry, data.validated_data["amount"])


class PhasedDepositApi(APIView):
    """Phase 1 deposits and commits; then a pause stands for a slow outside call
    (the window in which tests kill the process); phase 2 records that it returned."""

    @idempotent("test.phased_deposit", phased=True)
    def post(self, request: Request, idem: Phases) -> Response:
        data = DepositInput(data=request.data)
        data.is_valid(raise_exception=True)
        amount = data.validated_data["amount"]
        if idem.recovery_point == "started":
            with idem.phase("deposited"):
                idem.data["entry_id"] = _deposit(
                    request, amount, f"phased:{idem.record_id}"
                ).pk
                idem.data["amount"] = amount
        if not idem.resumed:  # the outside call hangs the first time only
            pause(data.validated_data["sleep"])
            if data.validated_data.get("fail") == "crash":  # and then fails
                raise RuntimeError("the outside call failed")
        return _created(_after_outside_call(idem), amount)


def _after_outside_call(idem: Phases) -> JournalEntry:
    if idem.recovery_point == "deposited":
        with idem.phase("outside_call_done"):
            idem.data["resumed"] = idem.resumed
    return JournalEntry.objects.get(pk=idem.data["entry_id"])


@register_resumer("test.phased_deposit")
def resume_phased_deposit(record: IdempotencyRecord, idem: Phases) -> HttpResponse:
    """What beat's completer runs for a phased deposit whose client never returned."""
    entry = _after_outside_call(idem)
    return _created(entry, idem.data["amount"]).render()
