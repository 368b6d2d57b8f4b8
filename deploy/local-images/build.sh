#!/usr/bin/env bash
# Build the stack's base images from Debian packages, for machines that reach Debian's
# package mirror but no image registry (our CI). Real users never need this: the
# Dockerfile and docker-compose.yml default to the public images (python:3.11-slim,
# postgres:15, redis:7, nginx:1.27).
#
#   deploy/local-images/build.sh          # builds what is missing, prints the variables
#   eval "$(deploy/local-images/build.sh)" && docker compose up --build
#
# A minimal Debian bookworm (debootstrap --variant=minbase, from the mirror apt already
# uses here, or DEBIAN_MIRROR) is imported as ledger-local/debian:bookworm; on it each
# *.Dockerfile beside this script installs Debian's python3, postgresql-15, redis-server
# or nginx-light. An image is tagged with a digest of its Dockerfile (and files), so it
# is built once and again only when its recipe changes. Progress goes to stderr; stdout
# is only the `NAME=image` lines compose reads (PYTHON_IMAGE, POSTGRES_IMAGE, ...).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # debootstrap's home, missing from some PATHs
here="$(cd "$(dirname "$0")" && pwd)"
base=ledger-local/debian:bookworm

log() { echo "local-images: $*" >&2; }

mirror() {  # the Debian mirror apt uses here
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        # deb822: the URIs of a stanza whose Suites name bookworm.
        uri=$(awk '
            /^[[:space:]]*$/ { if (suite && uris) { print uris; exit } suite = 0; uris = "" }
            /^URIs:/ { uris = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
            END { if (suite && uris) print uris }
        ' /etc/apt/sources.list.d/*.sources | head -n 1)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if ! have_image "$base"; then
    command -v debootstrap >/dev/null || {
        log "debootstrap is missing (apt-get install debootstrap)"
        exit 1
    }
    root=$(mktemp -d /var/tmp/ledger-debootstrap.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    src=$(mirror)
    log "debootstrap bookworm from $src (once)"
    debootstrap --variant=minbase bookworm "$root" "$src" >&2
    # Like the official debian images: no recommended packages, a clean apt cache.
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
        >"$root/etc/apt/apt.conf.d/90ledger-no-recommends"
    # No init system in a container: package scripts must not try to start services.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$base" >&2
    rm -rf "$root"
    trap - EXIT
fi

# The certificate authorities this machine added (Debian keeps them in
# /usr/local/share/ca-certificates) go into the Python image, so pip in the app's build
# reaches the package index as the host does (through a TLS-inspecting proxy, say).
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$here"/*.Dockerfile "$here"/*-entrypoint.sh "$context"/
mkdir "$context/ca-certificates"
if [ -d /usr/local/share/ca-certificates ]; then
    cp -r /usr/local/share/ca-certificates/. "$context/ca-certificates/"
fi

# The four builds run side by side (mostly waiting on the mirror); each one's output
# is shown only if it fails.
names=(python postgres redis nginx)
declare -A images pids
for name in "${names[@]}"; do
    files=("$context/$name.Dockerfile")
    for extra in "$context/$name"-*; do [ -e "$extra" ] && files+=("$extra"); done
    if [ "$name" = python ]; then
        while IFS= read -r -d '' cert; do files+=("$cert"); done \
            < <(find "$context/ca-certificates" -type f -print0 | sort -z)
    fi
    digest=$(cat "${files[@]}" | sha256sum | cut -c1-12)
    images[$name]="ledger-local/$name:$digest"
    if ! have_image "${images[$name]}"; then
        log "building ${images[$name]}"
        docker build --force-rm --network host --build-arg "BASE_IMAGE=$base" \
            -f "$context/$name.Dockerfile" -t "${images[$name]}" "$context" \
            >"$context/$name.log" 2>&1 &
        pids[$name]=$!
    fi
done
failed=0
for name in "${!pids[@]}"; do
    if ! wait "${pids[$name]}"; then
        log "building ${images[$name]} failed:"
        cat "$context/$name.log" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
for name in "${names[@]}"; do
    echo "$(echo "$name" | tr '[:lower:]' '[:upper:]')_IMAGE=${images[$name]}"
done
