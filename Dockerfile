# The app image: web (gunicorn), the Celery worker and beat, and the provider simulator
# all run it (docker-compose.yml). PYTHON_IMAGE is any Debian-based Python 3.11+ image;
# CI passes one it built from Debian's packages (deploy/local-images/build.sh).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=ledger.settings \
    LEDGER_DATA_DIR=/var/lib/ledger

# An unprivileged user runs everything; it owns the data directory (and so the named
# volumes mounted there start out owned by it) and a home of its own.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/app app \
    && mkdir -p /var/lib/ledger/static \
    && chown -R app:app /var/lib/ledger \
    && python3 -m venv /opt/venv

WORKDIR /app
# The pinned dependencies first, so a change to the code does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY manage.py README.md ./
COPY ledger ledger
COPY idempotency idempotency
COPY orders orders
COPY payments payments
COPY templates templates
COPY static static
# The compiled catalogues (django.mo) are checked in: the Chinese UI needs no gettext.
COPY locale locale

USER app
EXPOSE 8000
CMD ["gunicorn", "ledger.wsgi", "--config", "python:ledger.gunicorn", "--bind", "0.0.0.0:8000"]
