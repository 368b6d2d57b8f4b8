# `make run` serves everything on http://127.0.0.1:$(PORT); `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
PORT ?= 8000
export PATH := $(BIN):$(PATH)

.PHONY: install install-dev run worker beat test lint migrate bench bench-idempotency chaos chaos-cluster profile

$(VENV)/.installed-run: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-run
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

migrate: install
	$(BIN)/python manage.py migrate --noinput

# Checks the settings, migrates, seeds the demo data, then runs the Procfile's
# processes (ledger/supervisor.py) until Ctrl-C. `exec`: a SIGTERM that make passes
# on reaches serve itself, which stops the stack warmly.
run: install
	PORT=$(PORT) exec $(BIN)/python manage.py serve

worker: install
	$(BIN)/celery -A ledger worker --loglevel INFO

beat: install
	$(BIN)/celery -A ledger beat --loglevel INFO

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

test: install-dev lint
	$(BIN)/pytest -n 2 --dist loadfile
	LEDGER_TEST_DB=sqlite $(BIN)/pytest tests/ledger tests/idempotency/test_engine.py \
		tests/idempotency/test_concurrency.py tests/idempotency/test_housekeeping.py \
		tests/idempotency/test_keylocks.py \
		tests/payments/test_merchant_sub_accounts.py

# The compose stack for real (tests/ops/test_compose_up.py, which `make test` runs too):
# builds the images (base images from Debian's packages where debootstrap is installed,
# deploy/local-images/build.sh), `docker compose up` with a .env made from .env.example,
# a journey through nginx on 127.0.0.1:8080, then `docker compose down -v`. Needs a
# running docker engine and port 8080 free (fails, never skips, without them); not the
# host's PostgreSQL or Redis (REDIS_URL= keeps the test fixtures off Redis).
.PHONY: compose-test
compose-test: install-dev
	LEDGER_COMPOSE_TEST=required REDIS_URL= $(BIN)/pytest -v -rA tests/ops/test_compose_up.py

# What the layer costs and saves beside its peers (the naive design,
# django-idempotency-key, AWS Lambda Powertools, the floor) on pre-orders, orders and
# payments; bursts and crashes; one hot merchant; the purge under load; the key table
# grown to 10M records; memory. Prints tables and one JSON line (about 20 minutes;
# PostgreSQL on 127.0.0.1, its own redis-servers). Not part of `make test`, except
# its --quick smoke test. Options: BENCH_IDEMPOTENCY_ARGS="--quick" (about a minute),
# or e.g. "--seconds 4 --growth 10000,1000000 --purge-keys 200000".
BENCH_IDEMPOTENCY_ARGS ?=
bench-idempotency: install-dev
	$(BIN)/python bench/idempotency_overhead.py $(BENCH_IDEMPOTENCY_ARGS)

# CPU time and SQL statements per write request, and pyinstrument's call tree of one.
profile: install-dev
	$(BIN)/python bench/profile_requests.py $(PROFILE_ARGS)

# Proof under fire (bench/load.py): the real stack (gunicorn, Celery worker and beat,
# PostgreSQL, two redis-servers of its own, the provider simulator) driven by agents
# that retry every step; prints a table and one JSON line, exits 1 on a violation.
# `make chaos` also kills workers, restarts Redis and cuts replies during the load.
# Options: BENCH_ARGS="--seconds 60 --clients 8 --intents 200" (or --short, ~40 s).
BENCH_ARGS ?=
bench: install-dev
	$(BIN)/python bench/load.py $(BENCH_ARGS)

chaos: install-dev
	$(BIN)/python bench/load.py --chaos $(BENCH_ARGS)

# The chaos run across several app hosts (bench/cluster.py): 3 hosts with their own
# hostname and filesystem (gunicorn + Celery worker each, beat on two, one clock 3
# minutes ahead), nginx, a Redis Cluster (3 primaries, 3 replicas), RabbitMQ; hosts,
# a Redis primary, the beat host and RabbitMQ are killed or restarted during the load.
# Needs root (unshare), nginx, RabbitMQ on 127.0.0.1:5672 and libfaketime.
chaos-cluster: install-dev
	$(BIN)/python bench/cluster.py $(BENCH_ARGS)
