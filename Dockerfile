# dedupe-stage container image: the static binary on an empty base.
#
# The binary is built on the host first and copied in, so that building the
# image needs no base image from a registry (FROM scratch only). Two steps,
# which deploy/build-images.sh runs for you:
#
#   1. CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o deploy/build/dedupe-stage ./cmd/dedupe-stage
#      mkdir -p deploy/build/rootfs/data          # empty; becomes the /data volume, owned by 65532
#      mkdir -p deploy/build/rootfs/licenses && cp LICENSE NOTICE deploy/build/rootfs/licenses/
#   2. docker build -f Dockerfile -t dedupe-stage:local deploy/build
#
# The build context is deploy/build (git-ignored), not the repository root, so
# the context holds only what the image needs. A release's image is built
# without Docker by go run ./internal/release, with the labels below (a test
# keeps the two lists and the version equal).
#
# Run it in front of an existing NATS server:
#
#   docker run -v dedupe-data:/data -p 127.0.0.1:9464:9464 \
#       -e DEDUPE_NATS_URL=nats://your-nats:4222 -e DEDUPE_NATS_TOKEN=... dedupe-stage:local run
#
# or on its own, with its embedded nats-server. The image makes that server
# listen on every interface of the container (DEDUPE_EMBEDDED_HOST=0.0.0.0)
# so that producers can reach it through a published port; give it a token
# (or DEDUPE_EMBEDDED_USER and DEDUPE_EMBEDDED_PASSWORD) that every client
# must present:
#
#   docker run -v dedupe-data:/data -p 127.0.0.1:4222:4222 -p 127.0.0.1:9464:9464 \
#       -e DEDUPE_EMBEDDED_TOKEN=change-me dedupe-stage:local run --key-header Order-Id
#   nats -s nats://127.0.0.1:4222 --token change-me pub events.orders '{"order":1}' -H 'Order-Id:order-1'
#
# deploy/compose.yaml runs a separate NATS server next to it. The image holds
# no CA certificates: for NATS over TLS, mount the CA file and set
# nats.tls.ca_file in the config. A config file can be named with
# DEDUPE_CONFIG, so that the health check reads it too.
FROM scratch

COPY dedupe-stage /dedupe-stage
# /data is created by copying an empty directory with its owner set: scratch
# has no shell to chown at build or run time. A named volume mounted on /data
# starts with this owner.
COPY --chown=65532:65532 rootfs/ /

# The OCI labels of the release (internal/version.Release). build-images.sh
# sets version to the binary's own (with -dev off a release tag) and adds
# the revision.
LABEL org.opencontainers.image.title="dedupe-stage" \
      org.opencontainers.image.description="A NATS JetStream stage that forwards each intent once" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/dedupe-stage/dedupe-stage" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 65532:65532
# /inspect tells whoever reaches the port whether a key was seen: off in the
# image (metrics and health stay). -e DEDUPE_HTTP_INSPECT=true turns it on;
# DEDUPE_HTTP_INSPECT_ADDR=127.0.0.1:9465 serves it on its own listener.
ENV DEDUPE_DATA_DIR=/data \
    DEDUPE_HTTP_ADDR=0.0.0.0:9464 \
    DEDUPE_HTTP_INSPECT=false \
    DEDUPE_EMBEDDED_HOST=0.0.0.0
VOLUME ["/data"]
# 9464: /metrics /healthz /readyz; 4222: the embedded nats-server (when
# DEDUPE_NATS_URL is not set).
EXPOSE 9464 4222

# The healthcheck command reads the same environment (and $DEDUPE_CONFIG)
# as run, so it follows DEDUPE_HTTP_ADDR wherever it is set.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/dedupe-stage", "healthcheck"]
# SIGTERM finishes the batch in flight, closes the state and exits 0; give it
# time (docker stop -t, compose stop_grace_period, Kubernetes
# terminationGracePeriodSeconds) to do so.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/dedupe-stage"]
CMD ["run"]
