# nats-server with JetStream, for deploy/compose.yaml and the container test.
#
# Like the stage's image, the static binary is built on the host from the Go
# module the project already requires, then copied onto an empty base
# (deploy/build-images.sh runs both steps):
#
#   1. CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
#          -o deploy/build/nats-server github.com/nats-io/nats-server/v2
#      mkdir -p deploy/build/rootfs/data
#      cp deploy/nats-server.conf deploy/build/
#   2. docker build -f deploy/nats-server.Dockerfile -t dedupe-stage-nats:local deploy/build
#
# The server runs with deploy/nats-server.conf: JetStream on /data syncing
# every write, monitoring on 8222, and a token every client must present,
# taken from $NATS_TOKEN (docker run -e NATS_TOKEN=...; it refuses to start
# without one).
#
# The official nats image works as well; this one exists so that nothing has
# to be pulled from a registry.
FROM scratch

COPY nats-server /nats-server
COPY nats-server.conf /nats-server.conf
COPY --chown=65532:65532 rootfs/ /

USER 65532:65532
VOLUME ["/data"]
# 4222 clients, 8222 HTTP monitoring (/healthz, /varz, /jsz)
EXPOSE 4222 8222

ENTRYPOINT ["/nats-server"]
CMD ["-c", "/nats-server.conf", "-js"]
