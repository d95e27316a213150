#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for the sink package's tests and prints
# the line that points the tests at it:
#
#   export DEDUPE_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:55432/dedupe_test?sslmode=disable
#
# Run as root. Installs Debian's postgresql package when no PostgreSQL server
# binaries are present, then runs a private cluster (trust auth, loopback
# only, fsync off) in $DEDUPE_PG_DIR owned by the postgres user. Idempotent: a
# cluster already running from $DEDUPE_PG_DIR is reused; otherwise the
# directory is wiped and a fresh cluster is created. Progress goes to stderr,
# only the export line to stdout, so CI can do:
#
#   pg_env=$(sink/testdata/start-postgres.sh)
#   eval "$pg_env"
#
# "start-postgres.sh stop" stops the cluster.
#
# Environment: DEDUPE_PG_DIR (default ${TMPDIR:-/tmp}/dedupe-test-postgres),
# DEDUPE_PG_PORT (default 55432).
set -euo pipefail

DIR=${DEDUPE_PG_DIR:-${TMPDIR:-/tmp}/dedupe-test-postgres}
PORT=${DEDUPE_PG_PORT:-55432}
DB=dedupe_test

log() { echo "start-postgres: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root (it installs packages and switches to the postgres user)"
  exit 1
fi

# pgbin prints the newest /usr/lib/postgresql/<version>/bin that has initdb.
pgbin() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# as_postgres runs its arguments as the postgres user, from a directory that
# user can read.
as_postgres() {
  (cd / && su postgres -s /bin/bash -c "$(printf '%q ' "$@")")
}

BIN=$(pgbin || true)
if [ "${1:-}" = stop ]; then
  if [ -n "$BIN" ] && [ -f "$DIR/PG_VERSION" ]; then
    as_postgres "$BIN/pg_ctl" -D "$DIR" -m fast stop >&2 || true
  fi
  exit 0
fi

if [ -z "$BIN" ]; then
  log "installing Debian's postgresql"
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >&2
  BIN=$(pgbin) || { log "no initdb under /usr/lib/postgresql/*/bin after install"; exit 1; }
fi
if ! id postgres >/dev/null 2>&1; then
  log "creating the postgres user"
  useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi
log "using $BIN"

# running: the cluster in $DIR is up and accepts connections on $PORT.
running() {
  [ -f "$DIR/PG_VERSION" ] &&
    as_postgres "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1 &&
    "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 5
}

if running; then
  log "cluster in $DIR is already running"
else
  if [ -f "$DIR/PG_VERSION" ]; then
    # A stale cluster (e.g. left by a killed run): stop what is left of it.
    log "discarding the stale cluster in $DIR"
    as_postgres "$BIN/pg_ctl" -D "$DIR" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR"
  chown postgres: "$DIR"
  chmod 700 "$DIR"
  log "creating a cluster in $DIR"
  as_postgres "$BIN/initdb" -D "$DIR" -U postgres -A trust -E UTF8 --locale=C --no-sync >&2
  log "starting on 127.0.0.1:$PORT"
  as_postgres "$BIN/pg_ctl" -D "$DIR" -l "$DIR/log" -w -t 60 \
    -o "-k $DIR -p $PORT -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >&2 || { cat "$DIR/log" >&2; exit 1; }
fi

exists=$(as_postgres "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -Atc \
  "SELECT 1 FROM pg_database WHERE datname = '$DB'")
if [ "$exists" != 1 ]; then
  log "creating database $DB"
  as_postgres "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi

echo "export DEDUPE_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:$PORT/$DB?sslmode=disable"
