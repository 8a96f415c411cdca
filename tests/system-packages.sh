#!/usr/bin/env bash
# Debian packages that the tests drive for real: headless Chromium (the status page), tesseract
# (reads the page's screenshot), iproute2 (network namespaces for the remote-worker test), curl
# (the README's HTTP examples), kubectl (`kubectl kustomize` renders docker/k8s, offline), and
# podman with runc, mmdebstrap (the base image, from Debian's packages) and podman-compose, which
# build and run the container image.
set -euo pipefail
needed=()
command -v chromium >/dev/null || needed+=(chromium fonts-dejavu-core)
command -v tesseract >/dev/null || needed+=(tesseract-ocr)
command -v ip >/dev/null || needed+=(iproute2)
command -v curl >/dev/null || needed+=(curl)
command -v kubectl >/dev/null || needed+=(kubectl)
command -v podman >/dev/null || needed+=(podman)
command -v runc >/dev/null || needed+=(runc)
command -v mmdebstrap >/dev/null || needed+=(mmdebstrap)
command -v podman-compose >/dev/null || needed+=(podman-compose)
if ((${#needed[@]})); then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${needed[@]}"
fi
