from ledger.exceptions import DomainError


class AlreadyRefunded(DomainError):
    status = 409
    code = "already_refunded"
    title = "Already refunded"
    default_detail = "This payment was already refunded; it was not refunded again."


class PaymentNotRefundable(DomainError):
    status = 409
    code = "payment_not_refundable"
    title = "Payment cannot be refunded"
    default_detail = "Only a succeeded payment can be refunded."


class CallbackSignatureInvalid(DomainError):
    status = 401
    code = "callback_signature_invalid"
    title = "Callback signature invalid"
    default_detail = (
        "The X-Provider-Signature header is missing, malformed, stale, replayed or "
        "does not match the body."
    )
    # RFC 9110: a 401 names how to authenticate; here, the signed header.
    headers = {"WWW-Authenticate": 'Signature realm="provider-callbacks"'}


class CallbackMismatch(DomainError):
    status = 400
    code = "callback_mismatch"
    title = "Callback does not match a payment"
    default_detail = (
        "The callback's order, amount or provider transaction does not match a "
        "payment of ours."
    )


class CallbackEventReused(DomainError):
    status = 409
    code = "callback_event_reused"
    title = "Callback event id reused"
    default_detail = (
        "An event with this event_id was delivered before with another order, "
        "transaction, status or amount; the first one stands and this one changes "
        "nothing."
    )


class ProviderUnavailable(DomainError):
    status = 503
    code = "provider_unavailable"
    title = "Payment provider unavailable"
    default_detail = "The payment provider did not answer; retry with the same key."


class ProviderRefused(DomainError):
    status = 502
    code = "provider_refused"
    title = "Payment provider refused"
    default_detail = "The payment provider refused this charge."


class ProviderChargeUsed(DomainError):
    status = 409
    code = "provider_charge_used"
    title = "The provider's charge for this order was used"
    default_detail = (
        "The payment provider already collected a charge for this order, which was "
        "given back; it opens no other for the same order number. Pay it from the "
        "wallet."
    )


class PaymentNotCapturable(DomainError):
    status = 409
    code = "payment_not_capturable"
    title = "Payment cannot be captured"
    default_detail = (
        "Only an authorized payment can be captured; this one was captured, voided "
        "or expired."
    )


class CaptureExceedsAuthorization(DomainError):
    status = 422
    code = "capture_exceeds_authorization"
    title = "Capture exceeds the authorization"
    default_detail = "A capture may take at most the authorized amount."


class PaymentNotVoidable(DomainError):
    status = 409
    code = "payment_not_voidable"
    title = "Payment cannot be voided"
    default_detail = (
        "Only an authorized payment can be voided; this one was captured, voided or "
        "expired."
    )


class RefundReasonReserved(DomainError):
    status = 400
    refuses_form = True  # the corrected reason may use the key
    code = "refund_reason_reserved"
    title = "Refund reason reserved"
    default_detail = (
        "This refund reason is one only the system gives (a charge the provider "
        "collected for another amount, or refunded at the provider); give another."
    )
