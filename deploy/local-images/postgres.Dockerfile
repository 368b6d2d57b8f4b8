# Debian's PostgreSQL 15, standing for postgres:15 (build.sh): the same data directory,
# the same POSTGRES_PASSWORD / POSTGRES_USER / POSTGRES_DB variables on first start.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y postgresql-15 \
    && pg_dropcluster 15 main \
    && rm -rf /var/lib/apt/lists/*
ENV LANG=C.UTF-8 \
    PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
