"""Our side of the provider: a small HTTP client, never called inside a transaction.

The merchant order number travels as the provider's idempotency key, so a retried
charge request (ours, or a resumed pay request) gets the same transaction back.
"""

from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import connection

from .exceptions import ProviderRefused, ProviderUnavailable


@dataclass(frozen=True)
class ProviderCharge:
    txn_id: str
    merchant_order_no: str
    amount: int
    status: str  # PENDING / SUCCESS / FAILED / CANCELLED / REFUNDED
    pay_url: str


def _request(method: str, path: str, **kwargs) -> httpx.Response | None:
    if connection.in_atomic_block:
        # Holding a transaction (and its row locks) across a network call is the
        # bug this guard exists to catch.
        raise RuntimeError("the payment provider is never called inside a transaction")
    try:
        response = httpx.request(
            method,
            f"{settings.PAYMENT_PROVIDER_URL}{path}",
            headers={"X-Merchant-Secret": settings.PAYMENT_PROVIDER_SECRET},
            timeout=settings.PAYMENT_PROVIDER_TIMEOUT_SECONDS,
            **kwargs,
        )
    except httpx.HTTPError as exc:
        raise ProviderUnavailable(
            f"The payment provider did not answer: {exc}."
        ) from exc
    if response.status_code == 404:
        return None
    if response.status_code >= 500:
        raise ProviderUnavailable(
            f"The payment provider answered {response.status_code}; try again."
        )
    if response.status_code >= 400:
        raise ProviderRefused(
            f"The payment provider refused the charge ({response.status_code})."
        )
    return response


def _charge(data: dict) -> ProviderCharge:
    return ProviderCharge(
        txn_id=data["txn_id"],
        merchant_order_no=data["merchant_order_no"],
        amount=data["amount"],
        status=data["status"],
        pay_url=data["pay_url"],
    )


def provider_charge_create(
    *,
    merchant_order_no: str,
    amount: int,
    currency: str,
    description: str = "",
    return_url: str = "",
) -> ProviderCharge:
    """Ask the provider to open a charge (deduplicated by `merchant_order_no`);
    its pay page sends the payer back to `return_url` when they are done."""
    response = _request(
        "POST",
        "/charges",
        json={
            "merchant_order_no": merchant_order_no,
            "amount": amount,
            "currency": currency,
            "description": description[:255],
            "return_url": return_url,
        },
    )
    if response is None:
        raise ProviderUnavailable("The payment provider's charge endpoint is missing.")
    return _charge(response.json())


def provider_charge_get(*, merchant_order_no: str) -> ProviderCharge | None:
    """The provider's view of the charge for `merchant_order_no`, or None."""
    response = _request("GET", f"/charges/{merchant_order_no}")
    return None if response is None else _charge(response.json())


def provider_charge_cancel(*, merchant_order_no: str) -> ProviderCharge | None:
    """Cancel the charge for `merchant_order_no` so the payer can no longer confirm
    it; the provider's answer (CANCELLED), or None if it has no such charge.

    Idempotent at the provider: asking again answers the same. A charge the payer
    confirmed first is `ProviderRefused` (409): its money is in and comes back by a
    refund.
    """
    response = _request("POST", f"/charges/{merchant_order_no}/cancel")
    return None if response is None else _charge(response.json())


def provider_charge_refund(*, merchant_order_no: str) -> ProviderCharge:
    """Have the provider give a paid charge's money back to the payer; its answer
    (REFUNDED). Idempotent at the provider: asking again answers the same, the
    money goes back once. A charge that was never paid is `ProviderRefused` (409),
    and so is one the provider does not know (404): there is nothing to give back,
    and asking again will not change that."""
    response = _request("POST", f"/charges/{merchant_order_no}/refund")
    if response is None:
        raise ProviderRefused("The payment provider has no such charge to refund.")
    return _charge(response.json())
