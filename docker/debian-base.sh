#!/usr/bin/env bash
# A Debian 12 base image with Python 3.11, made from Debian's packages where no image registry is
# reachable (so no python:3.11-slim-bookworm to pull): mmdebstrap builds the root file system, podman
# imports it. Documentation, manual pages and translations are left out, as the slim images do.
#
#   bash docker/debian-base.sh [IMAGE]         (default localhost/bookworm-python:3.11)
#   podman build -f docker/Dockerfile --build-arg BASE_IMAGE=localhost/bookworm-python:3.11 .
set -euo pipefail
image=${1:-localhost/bookworm-python:3.11}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm "$work/base.tar"
podman import --quiet "$work/base.tar" "$image"
