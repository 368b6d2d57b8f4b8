"""The verdict of a load run, read from the database after the run settled.

Every intent the agents started must end with exactly one debit, or none with a clear
final answer (a stored refusal such as `insufficient_funds`); every answer an agent
got for a step, before and after it was SIGKILLed and restarted, must be the same
answer byte for byte; no key may be left in `processing`; every provider callback
must be processed and every provider payment settled once; `check_ledger` must pass;
and the money must add up to the unit.
"""

import json
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg

PAID_STATES = (20, 30, 40)


@dataclass
class Intent:
    """What the agents said about one intent."""

    name: str
    customer: str
    method: str = ""
    amount: int = 0
    # step -> every final answer the agents saw: (status, body)
    answers: dict[str, list[tuple[int, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # the pay answer that reached an agent just before it was SIGKILLed
    replied_before_kill: tuple[int, str] | None = None
    done: bool = False
    # "step status" -> how many attempts got it (0: no reply), final or not: what a
    # violation report shows of an intent that never got its final answer
    attempts: Counter[str] = field(default_factory=Counter)


def pay_status(intent: Intent) -> int | None:
    """The final answer of the step that moves money (a capture's, for a hold; a
    refused authorization is final too)."""
    answers = intent.answers.get("pay") or intent.answers.get("authorize")
    return answers[0][0] if answers else None


# A payment's success: 201 Created, or 200 for a capture (it changes a payment).
SUCCESS = {200, 201}


def judge_transfer(intent: Intent, moved: list[tuple]) -> str:
    """A transfer intent: one transfer if it was answered 201, none otherwise.
    Answers "" when it holds, else what went wrong ("double" and "lost" are
    counted as such)."""
    status = pay_status(intent)
    if status is None:
        return "lost"
    if len(moved) > 1:
        return "double"
    if status == 201 and len(moved) != 1:
        return "lost"
    if status != 201 and moved:
        return f"answered {status} but money moved"
    return ""


def check_answers(intent: Intent) -> list[str]:
    """Every answer to a step is the first answer, byte for byte."""
    problems = []
    for step, answers in intent.answers.items():
        if len(set(answers)) > 1:
            statuses = sorted({status for status, _ in answers})
            problems.append(
                f"{intent.name}: {len(set(answers))} different answers to {step} "
                f"(statuses {statuses})"
            )
    pay = intent.answers.get("pay")
    if intent.replied_before_kill and pay and intent.replied_before_kill != pay[0]:
        problems.append(
            f"{intent.name}: the pay answer after the restart differs from the "
            "one the killed agent was about to read"
        )
    return problems


def _rows(conn: psycopg.Connection, sql: str, *params: Any) -> list[tuple]:
    return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def database_facts(dsn: str) -> dict[str, Any]:
    """Everything the verdict needs from the database, in a few queries."""
    with psycopg.connect(dsn) as conn:
        orders = _rows(
            conn,
            "SELECT o.id, o.description, o.status, o.amount, u.username"
            " FROM orders_order o JOIN auth_user u ON u.id = o.owner_id",
        )
        payments = _rows(
            conn, "SELECT id, order_id, method, status, amount FROM payments_payment"
        )
        transfers = _rows(
            conn,
            "SELECT t.description, s.username, r.username, t.amount"
            " FROM ledger_transfer t JOIN auth_user s ON s.id = t.sender_id"
            " JOIN auth_user r ON r.id = t.recipient_id",
        )
        entries = _rows(
            conn, "SELECT reference FROM ledger_journalentry WHERE kind <> 'deposit'"
        )
        accounts = _rows(
            conn,
            "SELECT a.kind, u.username, a.balance FROM ledger_account a"
            " LEFT JOIN auth_user u ON u.id = a.owner_id",
        )
        processing = _rows(
            conn,
            "SELECT count(*), count(*) FILTER (WHERE locked_until < now())"
            " FROM idempotency_idempotencyrecord WHERE status = 'processing'",
        )[0]
        events = dict(
            _rows(
                conn, "SELECT status, count(*) FROM payments_providerevent GROUP BY 1"
            )
        )
        notifications = _rows(
            conn,
            "SELECT count(*), count(*) FILTER (WHERE delivered_at IS NULL),"
            " coalesce(sum(attempts), 0) FROM provider_sim_notification",
        )[0]
        shipments = dict(
            _rows(conn, "SELECT status, count(*) FROM payments_shipment GROUP BY 1")
        )
    return {
        "orders": orders,
        "payments": payments,
        "transfers": transfers,
        "references": [ref for (ref,) in entries],
        "accounts": accounts,
        "processing": processing,
        "events": events,
        "notifications": notifications,
        "shipments": shipments,
    }


def pending_work(dsn: str) -> int:
    """Work the stack still owes: keys in flight, callbacks unprocessed, provider
    payments pending, shipments not dispatched."""
    with psycopg.connect(dsn) as conn:
        (count,) = _rows(
            conn,
            "SELECT (SELECT count(*) FROM idempotency_idempotencyrecord"
            "         WHERE status = 'processing')"
            " + (SELECT count(*) FROM payments_providerevent WHERE status = 'received')"
            " + (SELECT count(*) FROM payments_payment WHERE status = 'pending')"
            " + (SELECT count(*) FROM payments_shipment WHERE status = 'pending')",
        )[0]
    return count


def check_ledger(env: dict[str, str], root: str) -> tuple[bool, dict]:
    done = subprocess.run(
        [f"{root}/.venv/bin/python", "manage.py", "check_ledger"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        report = {"stderr": done.stderr[-2000:]}
    return done.returncode == 0, report


def judge(
    intents: dict[str, Intent], facts: dict[str, Any], opening: dict[str, int]
) -> dict[str, Any]:
    """Count double debits, lost intents and money drift; name every violation."""
    violations: list[str] = []
    orders_of: dict[str, list[tuple]] = defaultdict(list)
    for order in facts["orders"]:
        orders_of[order[1]].append(order)
    payments_of: dict[int, list[tuple]] = defaultdict(list)
    for payment in facts["payments"]:
        payments_of[payment[1]].append(payment)
    references = Counter(facts["references"])

    double_debits = lost = 0
    outcomes: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    transfers_of: dict[str, list[tuple]] = defaultdict(list)
    received: Counter[str] = Counter()
    for transfer in facts["transfers"]:
        transfers_of[transfer[0]].append(transfer)
        spent[transfer[1]] += transfer[3]
        received[transfer[2]] += transfer[3]
    for intent in intents.values():
        violations += check_answers(intent)
        if intent.method == "transfer":
            problem = judge_transfer(intent, transfers_of.get(intent.name, []))
            double_debits += problem == "double"
            lost += problem == "lost"
            violations += [f"{intent.name}: {problem}"] if problem else []
            outcomes[f"transfer {pay_status(intent)}"] += 1
            continue
        orders = orders_of.get(intent.name, [])
        if len(orders) > 1:
            violations.append(f"{intent.name}: {len(orders)} orders")
        status = pay_status(intent)
        if not orders or status is None:
            lost += 1
            seen = ", ".join(f"{k} x{n}" for k, n in sorted(intent.attempts.items()))
            violations.append(
                f"{intent.name}: no final answer (order: {bool(orders)}; "
                f"attempts: {seen or 'none'})"
            )
            continue
        order_id, _, order_status, amount, customer = orders[0]
        debits = references[f"payment:{order_id}"] + sum(
            references[f"provider:{p[0]}"] for p in payments_of[order_id]
        )
        if debits > 1:
            double_debits += 1
            violations.append(f"{intent.name}: {debits} debits")
        paid = order_status in PAID_STATES
        if status in SUCCESS and not (paid and debits == 1):
            lost += 1
            violations.append(
                f"{intent.name}: answered 201 but order status {order_status}, "
                f"{debits} debits"
            )
        elif status not in SUCCESS and (paid or debits):
            violations.append(
                f"{intent.name}: answered {status} but the order is paid or debited"
            )
        outcomes[f"{intent.method} {status}"] += 1
        if paid and intent.method in ("balance", "hold"):
            spent[customer] += amount

    unknown_orders = set(orders_of) - set(intents)
    if unknown_orders:
        violations.append(f"orders no agent started: {sorted(unknown_orders)[:5]}")

    # (every merchant account, sub-accounts included, is ("merchant", None))
    balances: Counter = Counter()
    for kind, user, balance in facts["accounts"]:
        balances[kind, user] += balance
    drift = 0
    for customer, opened in opening.items():
        expected = opened - spent[customer] + received[customer]
        drift += abs(balances.get(("wallet", customer), 0) - expected)
    settled = sum(
        p[4] for p in facts["payments"] if p[3] == "succeeded"
    )  # balance and provider payments alike end at the merchant
    merchant = sum(b for (kind, _), b in balances.items() if kind == "merchant")
    drift += abs(merchant - settled)
    total = sum(balance for balance in balances.values())
    drift += abs(total)
    if drift:
        violations.append(f"money drift of {drift} minor units")

    processing, stuck = facts["processing"]
    if processing:
        violations.append(f"{processing} keys still processing ({stuck} past lease)")
    unprocessed = facts["events"].get("received", 0)
    if unprocessed:
        violations.append(f"{unprocessed} provider callbacks never processed")
    pending = sum(1 for p in facts["payments"] if p[3] == "pending")
    if pending:
        violations.append(f"{pending} provider payments still pending")
    return {
        "double_debits": double_debits,
        "lost_intents": lost,
        "stuck_keys": processing,
        "money_drift": drift,
        "outcomes": dict(sorted(outcomes.items())),
        "callbacks_processed": facts["events"].get("processed", 0),
        "callbacks_unprocessed": unprocessed,
        "notifications": facts["notifications"][0],
        "notifications_undelivered": facts["notifications"][1],
        "shipments": facts["shipments"],
        "violations": violations,
    }
