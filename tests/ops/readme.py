"""Run the README's examples as pasted against a live server.

Every ```sh block that calls the `make run` server (port 8000) with curl runs, in the
README's order, in one bash session in a temporary folder (later blocks use what
earlier ones set: `$NO`, `$PAYMENT`, ...). Only the `TOKEN=...` line is replaced by
the real token, and the address only when the server could not get port 8000. Each
curl call's HTTP status is checked against the comment under it: a status the comment
starts with (`# 201 ...`), or the `"status"` of the problem it shows; with neither, a
2xx. ```python blocks that call the server run too, with `TOKEN` set, and must print a
2xx status (the others show code to write, not to run). The
compose stack's examples (port 8080) are `tests/ops/test_compose_up.py`'s.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
# Each curl writes its status to stderr, so `$(curl ...)` captures only the body.
CURL_STATUS = "curl() { command curl -w '%{stderr}status %{http_code}\\n' \"$@\"; }\n"


def blocks(readme: Path, language: str) -> list[str]:
    return [
        body
        for lang, body in FENCE.findall(readme.read_text())
        if lang == language
        and (re.search(r"\bcurl\b", body) if language == "sh" else ":8000" in body)
        and ":8080" not in body  # the compose stack's: tests/ops/test_compose_up.py
    ]


def expected_statuses(block: str) -> list[str]:
    """One expectation per curl command: '201', or '2xx' when the README says none."""
    expected: list[str] = []
    for line in block.splitlines():
        stripped = line.strip()
        if re.search(r"\bcurl\b", stripped) and not stripped.startswith("#"):
            expected.append("2xx")
        elif stripped.startswith("#") and expected and expected[-1] == "2xx":
            said = re.match(r"#\s*(\d{3})\b", stripped) or re.search(
                r'"status": (\d{3})', stripped
            )
            if said:
                expected[-1] = said.group(1)
    return expected


def address(text: str, url: str) -> str:
    for origin in ("http://127.0.0.1:8000", "http://localhost:8000", "localhost:8000"):
        text = text.replace(origin, url if origin.startswith("http") else url[7:])
    return text


def run_readme_examples(readme: Path, url: str, token: str) -> None:
    shell = blocks(readme, "sh")
    assert shell, "the README has no curl examples"
    script = CURL_STATUS + "\n".join(shell)
    script = re.sub(r"(?m)^TOKEN=\.\.\..*$", f"TOKEN={token}", script)
    script = address(script, url)
    with tempfile.TemporaryDirectory() as workdir:  # nothing lands in the checkout
        result = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=workdir,
            env={**os.environ, "PAYMENT_PROVIDER_SECRET": ""},  # the README sets it
        )
    statuses = re.findall(r"^status (\d{3})$", result.stderr, re.M)
    expected = [status for block in shell for status in expected_statuses(block)]
    story = f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-2000:]}"
    assert len(statuses) == len(expected), f"{statuses} != {expected}\n{story}"
    for got, want in zip(statuses, expected, strict=True):
        assert got == want or (want == "2xx" and got.startswith("2")), (
            f"{statuses} != {expected}\n{story}"
        )

    for source in blocks(readme, "python"):
        program = f"TOKEN = {token!r}\n" + address(source, url)
        with tempfile.TemporaryDirectory() as workdir:  # where it keeps its keys
            ran = subprocess.run(
                [sys.executable, "-c", program],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=workdir,
                env={**os.environ, "PYTHONPATH": str(readme.parent)},
            )
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert re.match(r"2\d\d\b", ran.stdout.strip()), ran.stdout[-2000:]
