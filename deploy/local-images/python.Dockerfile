# Debian's Python 3.11 with venv, standing for python:3.11-slim (build.sh), trusting
# the certificate authorities the building machine added.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
COPY ca-certificates/ /usr/local/share/ca-certificates/
RUN apt-get update \
    && apt-get install -y python3 python3-venv ca-certificates \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
CMD ["python3"]
