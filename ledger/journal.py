"""The journal's hash chain: what a seal's hash is computed over.

`hash = SHA-256(prev_hash || canonical(entry and its postings))`, hex. The canonical
form is compact JSON with sorted keys of every column of the entry and of each of its
postings (in id order), so editing any of them, adding a posting or removing one,
changes the hash; the first seal's `prev_hash` is 64 zeros.
"""

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC

from .models import JournalEntry, Posting

GENESIS = "0" * 64


def canonical(entry: JournalEntry, postings: Iterable[Posting]) -> bytes:
    document = {
        "id": entry.pk,
        "reference": entry.reference,
        "kind": entry.kind,
        "currency": entry.currency,
        "description": entry.description,
        "params": entry.params,
        "created_at": entry.created_at.astimezone(UTC).isoformat(),
        "postings": [
            [p.pk, p.account_id, p.amount, p.balance_after, p.version]
            for p in sorted(postings, key=lambda p: p.pk)
        ],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return text.encode("utf-8")


def chain_hash(prev_hash: str, entry: JournalEntry, postings: Iterable[Posting]) -> str:
    digest = hashlib.sha256(prev_hash.encode("ascii"))
    digest.update(canonical(entry, postings))
    return digest.hexdigest()
