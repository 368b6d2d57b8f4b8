"""An automated agent that buys something and pays for it, safely under retries.

Kill it at any moment (Ctrl-C, SIGKILL, a crashed container) and run it again with the
same task name: every step carries the same idempotency key as before, so the order is
created once and paid once, and the second run prints the original answers.

    .venv/bin/python examples/agent.py --token TOKEN --task "buy tea #1" --amount 1999
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from idempotency.client import IdempotentClient, KeyReused, OutcomeUnknown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True)
    parser.add_argument("--task", required=True, help="names the intent; reuse it")
    parser.add_argument("--amount", type=int, default=1999, help="minor units")
    parser.add_argument("--store", default="agent-intents.sqlite3")
    args = parser.parse_args()

    client = IdempotentClient(args.url, args.token, store=args.store, deadline=30)
    try:
        preorder = client.post("/api/v1/preorders", {}, intent=f"{args.task}: number")
        if preorder.status_code != 201:  # a wrong token, say: a final answer
            print("pre-order:", preorder.status_code, preorder.text)
            return 1
        number = preorder.json()["merchant_order_no"]
        order = client.post(
            "/api/v1/orders",
            {
                "merchant_order_no": number,
                "amount": args.amount,
                "currency": "CNY",
                "description": args.task,
            },
            intent=f"{args.task}: order",
        )
        print("order:", order.status_code, json.dumps(order.json()))
        if order.status_code != 201:  # no order to pay
            return 1
        paid = client.post(
            f"/api/v1/orders/{number}/pay",
            {"method": "balance"},
            intent=f"{args.task}: pay",
        )
        replayed = "(replayed)" if paid.replayed else ""
        print("pay:", paid.status_code, replayed, paid.text)
    except KeyReused as exc:
        print("bug: this task name was used for a different request:", exc)
        return 2
    except OutcomeUnknown as exc:
        print("gave up waiting; the server says:", exc.status)
        if exc.retry_at is not None:  # it asked for no retry before then
            print("run this task again from", exc.retry_at.isoformat())
        return 3
    return 0 if paid.status_code < 400 else 1


if __name__ == "__main__":
    sys.exit(main())
