#!/usr/bin/env bash
# Debian packages that the tests drive for real: headless Chromium (the status page), tesseract
# (reads the page's screenshot), iproute2 (network namespaces for the remote-worker test), curl
# (the README's HTTP examples) and kubectl (`kubectl kustomize` renders docker/k8s, offline).
set -euo pipefail
needed=()
command -v chromium >/dev/null || needed+=(chromium fonts-dejavu-core)
command -v tesseract >/dev/null || needed+=(tesseract-ocr)
command -v ip >/dev/null || needed+=(iproute2)
command -v curl >/dev/null || needed+=(curl)
command -v kubectl >/dev/null || needed+=(kubectl)
if ((${#needed[@]})); then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${needed[@]}"
fi
