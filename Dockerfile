FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ledger ledger
COPY orders orders
COPY payments payments
COPY idempotency idempotency
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install --no-cache-dir -e .
ENV DJANGO_SETTINGS_MODULE=ledger.settings
EXPOSE 8000
