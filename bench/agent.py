"""One automated shopper for the load run: the shipped IdempotentClient, retried hard.

For each of its intents (`<agent>-<n>`) it takes a pre-order number, creates the order
(one in four by `items` of the stack's product, whose stock it takes) and pays it,
with the wallet balance or through the provider (then confirms on the
provider's pay page as the payer's browser would). Every step is an intent of
`idempotency.client.IdempotentClient`, whose keys live in a SQLite file that survives a
restart. Each step is sent once (or twice at the same instant, now and then) and then
`--retries` more times with the same key; every answer is printed so the runner can
check that they are all the same answer.

It prints one JSON object per line on stdout, for the runner:

    {"ev": "req", ...}       one HTTP attempt: step, status (0: broken), ms, replayed
    {"ev": "answer", ...}    a final answer to a step: status and body
    {"ev": "replied", ...}   a doomed pay request's answer arrived; the agent stops
                             here, before using it, until the runner SIGKILLs it
    {"ev": "done", ...}      the intent finished (its pay status)
    {"ev": "unknown", ...}   the client gave up on a step (OutcomeUnknown)

    .venv/bin/python bench/agent.py --url URL --token T --store S --agent a0 --first 0
"""

import argparse
import json
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from idempotency.client import IdempotentClient, OutcomeUnknown, Result

_print_lock = threading.Lock()

# The product one intent in four orders by items; bench/stack.py creates it with stock
# enough never to run out.
CHAOS_SKU = "CHAOS-TEA"


def emit(**event: Any) -> None:
    line = json.dumps(event)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Current(threading.local):
    """The step a thread is sending, so the transport can name its attempts."""

    intent = ""
    step = ""


class AgentTransport(httpx.HTTPTransport):
    """Times every attempt; stops after a doomed pay request's reply has arrived
    and before the client reads it, so the runner can SIGKILL the agent there."""

    def __init__(self, current: Current, doomed: set[str]) -> None:
        super().__init__()
        self.current = current
        self.doomed = doomed

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        try:
            response = super().handle_request(request)
            response.read()
        except httpx.TransportError:
            emit(
                ev="req",
                intent=self.current.intent,
                step=self.current.step,
                status=0,
                ms=_ms(started),
            )
            raise
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        emit(
            ev="req",
            intent=self.current.intent,
            step=self.current.step,
            status=response.status_code,
            ms=_ms(started),
            replayed=replayed,
        )
        intent = self.current.intent
        if self.current.step == "pay" and intent in self.doomed and _final(response):
            self.doomed.discard(intent)
            emit(
                ev="replied",
                intent=intent,
                status=response.status_code,
                body=response.content.decode(),
            )
            sys.stdin.readline()  # the runner kills us while we wait here
        return response


def _final(response: httpx.Response) -> bool:
    """An answer the client would stop at (not 5xx, 429 or 409 in flight)."""
    if response.status_code >= 500 or response.status_code == 429:
        return False
    return b"idempotency_key_in_flight" not in response.content


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.current = Current()
        transport = AgentTransport(self.current, set(args.doom.split(",")) - {""})
        http = httpx.Client(base_url=args.url, timeout=10, transport=transport)
        self.client = IdempotentClient(
            args.url,
            args.token,
            store=args.store,
            deadline=args.client_deadline,
            http=http,
        )
        self.rng = random.Random(args.agent)

    def send(self, intent: str, step: str, path: str, body: dict) -> Result:
        """The step, then `retries` more times with the same key; print each answer."""
        name = f"{intent}: {step}"
        width = 2 if self.rng.random() < self.args.concurrent else 1
        answers: list[Result] = []

        def one() -> None:
            self.current.intent, self.current.step = intent, step
            answers.append(self.client.post(path, body, intent=name))

        for _ in range(1 + self.args.retries):
            threads = [threading.Thread(target=one) for _ in range(width)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            width = 1
        if len(answers) < 1 + self.args.retries:
            raise OutcomeUnknown(name, "", None)  # a thread gave up
        for answer in answers:
            emit(
                ev="answer",
                intent=intent,
                step=step,
                status=answer.status_code,
                body=answer.content.decode(),
                replayed=answer.headers.get("Idempotent-Replayed") == "true",
            )
        return answers[0]

    def run_intent(self, n: int) -> None:
        intent = f"{self.args.agent}-{n}"
        amount = 100 + (n * 7919 + len(self.args.agent) * 31) % 4900
        if self.args.peer and n % 4 == 3:
            self.run_transfer(intent, amount // 10)
            return
        method = "provider" if n % 3 == 2 else "balance"
        if n % 6 == 4:
            method = "hold"  # authorize now, capture at once (manual capture)
        emit(ev="start", intent=intent, method=method, amount=amount)
        try:
            number = self.send(intent, "number", "/api/v1/preorders", {})
            order_no = number.json()["merchant_order_no"]
            order: dict[str, Any] = {"merchant_order_no": order_no}
            if n % 4 == 1:
                # By items: the order's stock is taken once, whatever the retries.
                quantity = 1 + n % 5
                order["items"] = [{"sku": CHAOS_SKU, "quantity": quantity}]
            else:
                order.update(amount=amount, currency="CNY")
            self.send(
                intent, "order", "/api/v1/orders", {**order, "description": intent}
            )
            if method == "hold":
                paid = self.hold_and_capture(intent, order_no)
            else:
                paid = self.send(
                    intent, "pay", f"/api/v1/orders/{order_no}/pay", {"method": method}
                )
        except OutcomeUnknown as exc:
            emit(ev="unknown", intent=intent, detail=str(exc))
            return
        if method == "provider" and paid.status_code == 201:
            confirm_on_pay_page(paid.json()["pay_url"])
        emit(ev="done", intent=intent, order=order_no, status=paid.status_code)

    def hold_and_capture(self, intent: str, order_no: str) -> Result:
        """Authorize (the wallet's money is held), then capture it: the capture is
        the step that moves money, so it is the one named `pay` (the kill before
        reading its reply, the verdict's one debit or none). A refused
        authorization (`insufficient_funds`) is the intent's final answer."""
        held = self.send(
            intent,
            "authorize",
            f"/api/v1/orders/{order_no}/pay",
            {"method": "balance", "capture": "manual"},
        )
        if held.status_code != 201:
            return held
        payment = held.json()["id"]
        return self.send(intent, "pay", f"/api/v1/payments/{payment}/capture", {})

    def run_transfer(self, intent: str, amount: int) -> None:
        """Send money to the peer agent's customer. The money step is named `pay`,
        as a payment's, so the kill before reading its reply and the verdict's one
        movement or none treat both alike."""
        emit(ev="start", intent=intent, method="transfer", amount=amount)
        body = {"to": self.args.peer, "amount": amount, "currency": "CNY"}
        try:
            sent = self.send(
                intent, "pay", "/api/v1/transfers", {**body, "description": intent}
            )
        except OutcomeUnknown as exc:
            emit(ev="unknown", intent=intent, detail=str(exc))
            return
        emit(ev="done", intent=intent, order="", status=sent.status_code)


def confirm_on_pay_page(pay_url: str) -> None:
    """What the payer's browser does: GET the page, POST Confirm (CSRF and all)."""
    for _ in range(20):
        try:
            with httpx.Client(timeout=10) as browser:
                page = browser.get(pay_url)
                if 'data-status="PENDING"' not in page.text:
                    return  # confirmed already (a restarted agent)
                token = re.search(
                    r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text
                )
                if token is None:
                    raise httpx.TransportError("no CSRF token on the pay page")
                answer = browser.post(
                    pay_url, data={"csrfmiddlewaretoken": token[1], "action": "confirm"}
                )
                if answer.status_code == 303:
                    return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--agent", required=True, help="names the intents")
    parser.add_argument("--first", type=int, default=0, help="first intent number")
    parser.add_argument("--count", type=int, default=10**9, help="intents at most")
    parser.add_argument("--only", default="", help="comma-separated intent numbers")
    parser.add_argument("--until", type=float, default=0, help="start none after")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--concurrent", type=float, default=0.3)
    parser.add_argument("--doom", default="", help="pay intents to stop at")
    parser.add_argument("--client-deadline", type=float, default=30)
    parser.add_argument("--peer", default="", help="every 4th intent: send it money")
    args = parser.parse_args()

    agent = Agent(args)
    if args.only:
        numbers = [int(n) for n in args.only.split(",")]
    else:
        numbers = list(range(args.first, args.first + args.count))
    for i, n in enumerate(numbers):
        # A restarted agent always finishes the intent it was killed in.
        if i and args.until and time.time() > args.until:
            break
        agent.run_intent(n)
    emit(ev="exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
