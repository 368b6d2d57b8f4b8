#!/bin/sh
# The part of the official postgres image's entrypoint the stack relies on, for the
# image build.sh makes from Debian's postgresql-15: on first start (an empty $PGDATA)
# create the cluster with POSTGRES_USER (default postgres) and POSTGRES_PASSWORD,
# password auth over TCP, and the database POSTGRES_DB; then run the server as the
# postgres user.
set -eu

if [ "${1:-}" = postgres ] && [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /run/postgresql
    chown -R postgres:postgres "$PGDATA" /run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --encoding=UTF8 \
        --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        # Single-user mode: no server listens yet, so no health check sees one early.
        echo "CREATE DATABASE \"$db\" OWNER \"$user\"" |
            postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
fi

exec "$@"
