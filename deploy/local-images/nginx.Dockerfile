# Debian's nginx-light, standing for nginx:1.27 (build.sh); with curl, as the official
# image has, for the health check.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y nginx-light curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*
EXPOSE 8080
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
