#!/usr/bin/env bash
# Builds the two images deploy/compose.yaml runs, without pulling anything:
# static binaries built here with the Go toolchain, then copied onto empty
# (FROM scratch) bases by docker build.
#
#   deploy/build-images.sh            # dedupe-stage:local and dedupe-stage-nats:local
#   TAG=v1 deploy/build-images.sh     # dedupe-stage:v1 and dedupe-stage-nats:v1
#
# Environment (all optional):
#   TAG          image tag (default local)
#   STAGE_IMAGE  stage image name (default dedupe-stage)
#   NATS_IMAGE   nats-server image name (default dedupe-stage-nats)
#   BUILD_DIR    where binaries and the build context go (default deploy/build, git-ignored)
#   VERSION      version stamped into the binary and the image's label (default: the
#                release, internal/version.Release, with -dev unless HEAD is its tag)
#   REVISION     VCS revision stamped into the binary (default: git rev-parse HEAD)
#   GOARCH       target architecture (default: the Docker engine's)
#   ONLY         "stage" or "nats" to build one image
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

tag=${TAG:-local}
stage_image=${STAGE_IMAGE:-dedupe-stage}
nats_image=${NATS_IMAGE:-dedupe-stage-nats}
build_dir=${BUILD_DIR:-$root/deploy/build}
release=$(sed -n 's/^const Release = "\(.*\)"$/\1/p' internal/version/version.go)
if [ -z "${VERSION:-}" ]; then
  VERSION=$release-dev
  if [ "$(git describe --tags --exact-match 2>/dev/null)" = "v$release" ] && git diff --quiet HEAD 2>/dev/null; then
    VERSION=$release
  fi
fi
version=$VERSION
revision=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
only=${ONLY:-}

# Binaries for the engine's OS and architecture, which may not be the host's
# (Docker Desktop on macOS runs a Linux engine).
export GOOS=linux
if [ -z "${GOARCH:-}" ]; then
  GOARCH=$(docker version --format '{{.Server.Arch}}' 2>/dev/null || go env GOARCH)
fi
export GOARCH
export CGO_ENABLED=0

mkdir -p "$build_dir/rootfs/data" "$build_dir/rootfs/licenses"
chmod 0755 "$build_dir/rootfs" "$build_dir/rootfs/data" "$build_dir/rootfs/licenses"
# The licence and the notices of the libraries built in travel with the binary.
cp "$root/LICENSE" "$root/NOTICE" "$build_dir/rootfs/licenses/"

if [ "$only" != "nats" ]; then
  echo "--- go build dedupe-stage $version ($GOOS/$GOARCH)"
  go build -trimpath -ldflags "-s -w -X main.version=$version -X main.revision=$revision" -o "$build_dir/dedupe-stage" ./cmd/dedupe-stage
  echo "--- docker build $stage_image:$tag"
  docker build -q -f "$root/Dockerfile" -t "$stage_image:$tag" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" "$build_dir"
fi

if [ "$only" != "stage" ]; then
  echo "--- go build nats-server ($GOOS/$GOARCH)"
  # The version go.mod requires, so the server matches what the tests run against.
  go build -trimpath -ldflags "-s -w" -o "$build_dir/nats-server" github.com/nats-io/nats-server/v2
  cp "$root/deploy/nats-server.conf" "$build_dir/nats-server.conf"
  echo "--- docker build $nats_image:$tag"
  docker build -q -f "$root/deploy/nats-server.Dockerfile" -t "$nats_image:$tag" "$build_dir"
fi
