#!/usr/bin/env bash
# Runs every test of dedupflow against real servers: it installs what is missing
# (Redis, PostgreSQL, Chromium, the official Pub/Sub emulator, gcloud, the Node
# and Python clients, a JDK and Maven, buildah and promtool), starts each on a free loopback port, builds the
# container image, exports where they are, then runs every test stage (vet and
# staticcheck, go test -race, the end-to-end tests, deploy/validate, a run
# without -race, brief fuzzing, the benchmark smoke run) and lists every failed
# stage at the end. Services stop when the script exits.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/dedupflow-test.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "${pgdata:-}" ] && [ -d "$pgdata" ]; then
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
  fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

log() { printf '== %s\n' "$*" >&2; }
# served NAME LOG: the server just started in the background stops with the
# script; if it stops before, the summary says so and shows the end of LOG.
servers=()
served() { pids+=($!); servers+=("$1|$!|$2"); }

# --- install what is missing -------------------------------------------------
emulator=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator
# pgserver prints the bin folder of the highest PostgreSQL server version
# installed (Debian's layout: /usr/lib/postgresql/VERSION/bin), or nothing.
pgserver() {
  local p
  for p in /usr/lib/postgresql/*/bin/postgres; do
    if [ -x "$p" ]; then printf '%s\n' "${p%/postgres}"; fi
  done | sort -V | tail -n 1
}
need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -n "$(pgserver)" ] || need+=(postgresql) # whichever version the distribution ships
command -v chromium >/dev/null || need+=(chromium)
[ -x "$emulator" ] || need+=(google-cloud-cli-pubsub-emulator)
spanneremu=/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main
bigtableemu=/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator
[ -x "$spanneremu" ] || need+=(google-cloud-cli-spanner-emulator)
[ -x "$bigtableemu" ] || need+=(google-cloud-cli-bigtable-emulator)
command -v gcloud >/dev/null || need+=(google-cloud-cli)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
command -v node >/dev/null || need+=(nodejs npm)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
command -v buildah >/dev/null || need+=(buildah)
command -v promtool >/dev/null || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing ${need[*]}: install them (as root: apt-get install -y ${need[*]})" >&2
    exit 1
  fi
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
waitport() { # host port seconds
  for _ in $(seq 1 $(( $3 * 10 ))); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1:$2 after $3 s" >&2; return 1
}

# --- Redis ---------------------------------------------------------------------
rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
  >"$work/redis.log" 2>&1 &
served "redis" "$work/redis.log"
waitport 127.0.0.1 "$rport" 20
export DEDUPFLOW_REDIS_URL="redis://127.0.0.1:$rport/0"
export DEDUPFLOW_REDIS_SERVER="$(command -v redis-server)"
log "redis on $rport"

# --- PostgreSQL (initdb as the unprivileged postgres user) ---------------------
pgbin=$(pgserver)
if [ -z "$pgbin" ]; then
  echo "no PostgreSQL server in /usr/lib/postgresql/*/bin (install the postgresql package)" >&2
  exit 1
fi
pgdata="$work/pg"
pport=$(freeport)
mkdir -p "$pgdata" && chown postgres "$pgdata"
runuser -u postgres -- "$pgbin/initdb" -D "$pgdata" -A trust -U postgres >/dev/null
runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdata" -l "$pgdata/log" -w \
  -o "-p $pport -k $pgdata -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
export DEDUPFLOW_POSTGRES_URL="postgres://postgres@127.0.0.1:$pport/postgres?sslmode=disable"
log "postgres on $pport"

# --- Google's official Pub/Sub emulator (the reference peer) -------------------
eport=$(freeport)
"$emulator" --host=127.0.0.1 --port="$eport" >"$work/emulator.log" 2>&1 &
served "pubsub emulator" "$work/emulator.log"
waitport 127.0.0.1 "$eport" 60
export DEDUPFLOW_EMULATOR_HOST="127.0.0.1:$eport"
log "pubsub emulator on $eport"

# --- Google's Spanner and Bigtable emulators (the table sinks' servers) -------
# Exported under the clients' own names: the sinks' tests and the binaries
# they start reach the emulators as any Google client does.
sport=$(freeport)
"$spanneremu" --host_port "127.0.0.1:$sport" >"$work/spanner.log" 2>&1 &
served "spanner emulator" "$work/spanner.log"
bport=$(freeport)
"$bigtableemu" -host 127.0.0.1 -port "$bport" >"$work/bigtable.log" 2>&1 &
served "bigtable emulator" "$work/bigtable.log"
waitport 127.0.0.1 "$sport" 60 && waitport 127.0.0.1 "$bport" 60
export SPANNER_EMULATOR_HOST="127.0.0.1:$sport" BIGTABLE_EMULATOR_HOST="127.0.0.1:$bport"
log "spanner emulator on $sport, bigtable emulator on $bport"

# --- Chromium and the Node client ---------------------------------------------
export DEDUPFLOW_CHROMIUM="$(command -v chromium)"
if [ -f "$root/testdata/node/package.json" ]; then
  if [ ! -d "$root/testdata/node/node_modules" ]; then
    log "npm install (official Node client)"
    (cd "$root/testdata/node" && npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1) ||
      (cd "$root/testdata/node" && npm install --no-audit --no-fund --loglevel=error)
  fi
  export DEDUPFLOW_NODE_DIR="$root/testdata/node"
fi

# --- the official Python client ----------------------------------------------
# A virtual environment per testdata/python/requirements.txt, kept in the user's
# cache and named by the file's hash: the first run fetches from PyPI, later
# runs are offline, and a changed pin gets a fresh one.
pyreq="$root/testdata/python/requirements.txt"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/dedupflow/venv-$(sha256sum "$pyreq" | cut -c1-16)"
if [ ! -e "$venv/.complete" ]; then
  log "pip install (official Python client) into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$pyreq"
  touch "$venv/.complete"
fi
export DEDUPFLOW_PYTHON="$venv/bin/python"

# --- goccy/bigquery-emulator (the BigQuery sink's server) ----------------------
# Built once from the Go module proxy into the user's cache (`go install` is
# refused for it; the build takes about 11 min and 6.5 GB on 2 cores), then reused.
bqemu="${XDG_CACHE_HOME:-$HOME/.cache}/dedupflow/bigquery-emulator-v0.8.1"
if [ ! -x "$bqemu" ]; then
  log "building bigquery-emulator v0.8.1 into $bqemu (once)"
  bqsrc=$(cd "$work" && GOWORK=off go mod download -json github.com/goccy/bigquery-emulator@v0.8.1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  (cd "$bqsrc" && GOWORK=off GOFLAGS=-mod=mod go build -o "$bqemu.part" ./cmd/bigquery-emulator)
  mv "$bqemu.part" "$bqemu"
fi
bqrest=$(freeport) bqgrpc=$(freeport)
"$bqemu" --project=dedupflow --host=127.0.0.1 --port="$bqrest" --grpc-port="$bqgrpc" >"$work/bigquery.log" 2>&1 &
served "bigquery emulator" "$work/bigquery.log"
waitport 127.0.0.1 "$bqrest" 60 && waitport 127.0.0.1 "$bqgrpc" 60
export BIGQUERY_EMULATOR_HOST="127.0.0.1:$bqrest" BIGQUERY_STORAGE_EMULATOR_HOST="127.0.0.1:$bqgrpc"
export BIGQUERY_EMULATOR_PROJECT=dedupflow
log "bigquery emulator on $bqrest (REST) and $bqgrpc (Storage API)"

# --- fsouza/fake-gcs-server (Cloud Storage subscriptions' server) -----------
# Built once from the Go module proxy into the user's cache; in memory, plain HTTP.
gcs="${XDG_CACHE_HOME:-$HOME/.cache}/dedupflow/fake-gcs-server-v1.56.1"
if [ ! -x "$gcs" ]; then
  log "building fake-gcs-server v1.56.1 into $gcs (once)"
  GOWORK=off GOFLAGS=-mod=mod GOBIN="$work/gcsbin" go install github.com/fsouza/fake-gcs-server@v1.56.1
  mv "$work/gcsbin/fake-gcs-server" "$gcs"
fi
gport=$(freeport)
"$gcs" -scheme http -host 127.0.0.1 -port "$gport" -backend memory >"$work/gcs.log" 2>&1 &
served "fake-gcs-server" "$work/gcs.log"
waitport 127.0.0.1 "$gport" 30
export DEDUPFLOW_STORAGE_EMULATOR_HOST="http://127.0.0.1:$gport"
log "fake-gcs-server on $gport"

# --- the tutorial's Java programs (examples/) ---------------------------------
# Each jar is built once per run. Maven works offline when ~/.m2 holds what the
# build needs already, and reaches Maven Central only on the first run.
mvnpackage() { # folder
  log "mvn package: $1"
  (cd "$1" && { mvn -B -q -o -DskipTests package >/dev/null 2>&1 || mvn -B -q -DskipTests package; })
}
mvnpackage examples/spring-tutorial
export DEDUPFLOW_SPRING_JAR="$root/examples/spring-tutorial/target/spring-tutorial.jar"
mvnpackage examples/spring-tutorial-2020
export DEDUPFLOW_SPRING2020_JAR="$root/examples/spring-tutorial-2020/target/spring-tutorial-2020.jar"
mvnpackage examples/beam-reference
export DEDUPFLOW_BEAM_JAR="$root/examples/beam-reference/target/beam-reference.jar"

# Every server above is running: a test that cannot find one fails, never skips.
export DEDUPFLOW_REQUIRE_SERVERS=1

# --- the container image ------------------------------------------------------
# No registry is reachable here, so the Dockerfile's build stage (FROM golang)
# cannot run: the script that stage runs builds the image's files on this
# machine, and buildah builds the Dockerfile's final stage over them
# (ROOTFS=prebuilt), in a container store of its own under $work. The deploy
# tests run the image's files (a container cannot start here: crun's setrlimit
# is denied).
log "container image (./Dockerfile's final stage, buildah)"
mkdir -p "$work/image" "$work/containers"
cp Dockerfile "$work/image/"
deploy/image/rootfs.sh "$work/image/prebuilt"
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' \
  "$work/containers/root" "$work/containers/run" >"$work/containers/storage.conf"
export CONTAINERS_STORAGE_CONF="$work/containers/storage.conf"
export DEDUPFLOW_IMAGE=localhost/dedupflow:test
buildah bud --quiet --layers=false --build-arg ROOTFS=prebuilt -t "$DEDUPFLOW_IMAGE" "$work/image" >/dev/null

# --- the tests -----------------------------------------------------------------
# Setup above stops at its first error. From here every stage runs whatever
# became of the ones before, so one failure hides no other; the summary at the
# end lists each stage's result and time, and the script fails if any did.
results=()
failures=0
# stage NAME FUNCTION: runs FUNCTION in a subshell that stops at its first
# failing command (set -e holds there: the call is not part of a || list).
stage() {
  local name=$1 start=$SECONDS status
  log "$name"
  set +e
  ( set -e; "$2" )
  status=$?
  set -e
  record "$name" "$status" $((SECONDS - start))
}
record() { # name status seconds
  if [ "$2" = 0 ]; then
    results+=("ok    $1 ($3 s)")
  else
    results+=("FAIL  $1 (exit $2, $3 s)")
    failures=$((failures + 1))
  fi
}

test_args=("$@")
vet() {
  staticcheck=$(go env GOPATH)/bin/staticcheck
  [ -x "$staticcheck" ] || go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
  # GOWORK=off: the module users import is tested on its own go.mod, not on the
  # versions that the workspace's other modules (go.work) would bring in.
  GOWORK=off go vet ./...
  go vet ./bench/...
  GOWORK=off "$staticcheck" ./...
  "$staticcheck" ./bench/... ./e2e/...
}
unit() {
  # -parallel: the paced end-to-end tests mostly wait on servers and timers, so
  # more of them run at once than there are cores.
  GOWORK=off go test -race -count=1 -parallel 12 -timeout 40m "${test_args[@]}" ./...
}
benchtests() { go test -count=1 "${test_args[@]}" ./bench/...; }
e2e() {
  cd e2e
  GOWORK=off go vet ./...
  GOWORK=off go test -race -count=1 -parallel 12 -timeout 40m "${test_args[@]}" ./...
}
validate() { cd deploy/validate && GOWORK=off go vet ./... && GOWORK=off go test -count=1 ./...; }
norace() { go test -count=1 -run '^TestRedeliveryAfterDeadline$' ./broker/; }
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime 10s ./dedup/; }
fuzz_timestamp() { fuzz FuzzParseTimestamp; }
fuzz_keyof() { fuzz FuzzKeyOf; }
fuzz_jsonkey() { fuzz FuzzJSONKey; }
benchsmoke() {
  # every benchmark contender starts and is correct (Bento only when given)
  go run ./bench --quick ${DEDUPFLOW_BENTO:+--bento "$DEDUPFLOW_BENTO"}
}

# beside NAME FUNCTION: runs FUNCTION in the background, beside the stages that
# follow; its output and result come at the end (collect), with its own time.
# The end-to-end tests and the benchmark smoke run mostly wait on the
# processes they start, and the packages' tests wait on servers and timers
# once compiled, so these three and vet share the cores.
beside_names=() beside_pids=() beside_logs=()
beside() {
  local log="$work/beside-${#beside_pids[@]}.log"
  log "$1: started, beside the stages below; its output follows them"
  (
    start=$SECONDS
    set +e
    ( set -e; "$2" ) >"$log" 2>&1
    status=$?
    echo "$status $((SECONDS - start))" >"$log.result"
    exit "$status"
  ) &
  beside_names+=("$1") beside_pids+=($!) beside_logs+=("$log")
}
collect() {
  local i status seconds
  for i in "${!beside_pids[@]}"; do
    wait "${beside_pids[$i]}" || true
    log "${beside_names[$i]}"
    cat "${beside_logs[$i]}"
    read -r status seconds <"${beside_logs[$i]}.result" || { status=1 seconds=0; }
    record "${beside_names[$i]}" "$status" "$seconds"
  done
}

beside "go test: e2e (the binary under kills, failover, outages and a flaky network)" e2e
beside "benchmark smoke run" benchsmoke
beside "go vet, staticcheck" vet
stage "go test" unit
stage "go test: bench" benchtests
stage "go test: deploy/validate (Kubernetes and compose types, a module of its own)" validate
stage "go test, without -race: the reference runs that pstest's own data race keeps out of -race" norace
stage "fuzz FuzzParseTimestamp (brief)" fuzz_timestamp
stage "fuzz FuzzKeyOf (brief)" fuzz_keyof
stage "fuzz FuzzJSONKey (brief)" fuzz_jsonkey
collect

# A server that stopped on its own fails the tests that came after: say which.
for s in "${servers[@]}"; do
  IFS='|' read -r name pid file <<<"$s"
  if ! kill -0 "$pid" 2>/dev/null; then
    log "$name stopped during the tests; the end of its log:"
    tail -n 40 "$file" >&2 || true
  fi
done
log "summary"
printf '%s\n' "${results[@]}" >&2
if [ "$failures" -gt 0 ]; then
  log "$failures stage(s) failed"
  exit 1
fi
