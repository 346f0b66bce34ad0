#!/usr/bin/env bash
# `make image`: build the omniray image on this machine (docs/deploy.md#image).
#   docker/build.sh [ENGINE]     ENGINE: cpu (default) or gpu; tag $IMAGE (default omniray:<appVersion>)
# Where no registry is reachable (BASE_IMAGE=local, the default here) the base is made locally with
# mmdebstrap (Debian bookworm + python3 + the runtime packages); BASE_IMAGE=<ref> uses an image ref.
# Starts dockerd when none answers (root; no bridge: builds and containers use the host network).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${1:-cpu}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/omniray/Chart.yaml)
IMAGE=${IMAGE:-omniray:${VERSION}}
BASE_IMAGE=${BASE_IMAGE:-local}
LOCAL_BASE=omniray-base:bookworm
need() { command -v "$1" >/dev/null || { echo "[image] installing $2"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; }
need dockerd docker.io
[ "$BASE_IMAGE" = local ] && need mmdebstrap mmdebstrap
# Debian's Docker 20.10 client (/usr/bin/docker) builds with its built-in BuildKit; a newer client
# elsewhere on PATH wants the buildx plugin. Looked up after docker.io is installed, not before.
DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}

if ! "$DOCKER" info >/dev/null 2>&1; then
  echo "[image] starting dockerd (log: /tmp/omniray-dockerd.log)"
  nohup dockerd --iptables=false --ip-masq=false --bridge=none >/tmp/omniray-dockerd.log 2>&1 &
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  "$DOCKER" info >/dev/null
fi

if [ "$BASE_IMAGE" = local ]; then
  if ! "$DOCKER" image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    echo "[image] making $LOCAL_BASE with mmdebstrap"
    rootfs=$(mktemp -d)/rootfs.tar
    mmdebstrap --quiet --variant=minbase \
      --include=ca-certificates,python3,python3-venv,espeak-ng,libgomp1,libnuma1 \
      bookworm "$rootfs"
    "$DOCKER" import "$rootfs" "$LOCAL_BASE" >/dev/null
    rm -rf "$(dirname "$rootfs")"
  fi
  BASE_IMAGE=$LOCAL_BASE
fi

# A CPU torch from the wheels pip is pointed at (PIP_FIND_LINKS), where the PyTorch index is out of reach.
rm -f docker/wheels/*.whl
for dir in ${PIP_FIND_LINKS:-}; do [ -d "$dir" ] && cp "$dir"/torch-*+cpu-*.whl docker/wheels/ 2>/dev/null || true; done
index=()
compgen -G 'docker/wheels/torch-*.whl' >/dev/null && index=(--build-arg TORCH_INDEX=)

secret=()
[ -s /etc/ssl/certs/ca-certificates.crt ] && secret=(--secret id=cacert,src=/etc/ssl/certs/ca-certificates.crt)
start=$(date +%s)
log=/tmp/omniray-image-build.log
echo "[image] building $IMAGE (ENGINE=$ENGINE, BASE=$BASE_IMAGE; log: $log)"
if ! DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
    --build-arg BASE="$BASE_IMAGE" --build-arg ENGINE="$ENGINE" "${index[@]}" "${secret[@]}" \
    -f docker/Dockerfile -t "$IMAGE" . >"$log" 2>&1; then
  tail -40 "$log"
  exit 1
fi
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
echo "[image] $IMAGE built in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB"
