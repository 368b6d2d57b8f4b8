"""A process that issues merchant order numbers, for the worker id lease tests.

`python -m tests.idempotency.minter burst FORKS COUNT OUT`: issue one number, fork
FORKS children, and every process (the parent too) issues COUNT numbers, writing
them to OUT/<pid>.txt. `... serve`: answer each line on stdin ("mint") with a number,
or with `refused <code>`.
"""

import os
import sys
from pathlib import Path

import django


def mint_many(count: int, out: Path) -> None:
    from idempotency.snowflake import next_snowflake

    numbers = [next_snowflake() for _ in range(count)]
    (out / f"{os.getpid()}.txt").write_text("\n".join(map(str, numbers)))


def burst(forks: int, count: int, out: Path) -> None:
    from idempotency.snowflake import next_snowflake

    next_snowflake()  # the parent holds a worker id before it forks
    children = []
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            try:
                mint_many(count, out)
            finally:
                os._exit(0)
        children.append(pid)
    mint_many(count, out)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert status == 0


def serve() -> None:
    from idempotency.exceptions import IdIssuerUnavailable
    from idempotency.snowflake import next_snowflake

    for line in sys.stdin:
        if line.strip() != "mint":
            continue
        try:
            answer = str(next_snowflake())
        except IdIssuerUnavailable as refused:
            answer = f"refused {refused.code}"
        print(answer, flush=True)


if __name__ == "__main__":
    django.setup()
    if sys.argv[1] == "burst":
        burst(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        serve()
