"""A payment provider simulator: a separate institution with its own tables.

It behaves like the real thing as far as this project cares: it deduplicates charge
requests by the merchant's order number, shows the payer a pay page, settles only
when the payer confirms there, answers status queries, and delivers signed callbacks
at least once from its own Celery task on a retry schedule (twice on purpose when
`PROVIDER_DELIVER_TWICE` is set). Our code reaches it only over HTTP
(`payments.provider_client`), so it can be swapped for a real provider.
"""
