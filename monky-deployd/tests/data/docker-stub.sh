#!/bin/bash
# A stand-in for `docker` in monky-deployd's tests: it records every call and keeps a small
# model of the engine's containers in containers.json (Engine API shape), which the tests' fake
# engine socket serves. The agent gives its children a minimal environment, so the scenario is
# read from stub.env beside this script.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
[ -f "$here/stub.env" ] && . "$here/stub.env"
{
  printf '@@CALL'
  printf ' %q' "$@"
  printf '\n@@CWD %s\n' "$PWD"
  env | sort | sed 's/^/@@ENV /'
} >>"$here/calls.log"

# DAEMON_DOWN: the CLI works but every call that needs the engine fails the way docker's does.
daemon_down() {
  [ -n "$DAEMON_DOWN" ] || return 0
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
  exit 1
}

[ "$1" = compose ] || {
  case "$1" in
    image) daemon_down; echo "Total reclaimed space: 0B"; exit 0 ;;
    ps) daemon_down; exit 0 ;;
    info) daemon_down; echo "{\"ServerVersion\":\"28.3.0\",\"DockerRootDir\":\"$here\"}"; exit 0 ;;
    *) echo "stub docker: unexpected: $*" >&2; exit 99 ;;
  esac
}
shift
# NO_COMPOSE: this docker has no compose plugin.
[ -n "$NO_COMPOSE" ] && { echo "docker: 'compose' is not a docker command." >&2; exit 1; }
[ "$1" = version ] && { echo "Docker Compose version v${COMPOSE_VERSION:-2.32.0}"; exit 0; }
compose_args=("$@")

project=
file=
envfile=
while [ $# -gt 0 ]; do
  case "$1" in
    -p) project=$2; shift 2 ;;
    -f) file=$2; shift 2 ;;
    --env-file) envfile=$2; shift 2 ;;
    --ansi | --project-directory | --profile) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
sub=$1
shift

# FAULT_IF: the failures above hit only a compose file that contains this text (one release),
# so that another release (the one fallen back to) still comes up.
if [ -n "$FAULT_IF" ] && ! grep -qF -- "$FAULT_IF" "$file" 2>/dev/null; then
  PULL_FAIL= UP_FAIL= HEALTH=healthy
fi

containers() { # containers STATE HEALTH: one container per service in $SERVICES
  local first=1
  printf '['
  for s in ${SERVICES:-web}; do
    [ $first = 1 ] || printf ','
    first=0
    status="Up 1 second"
    [ -n "$2" ] && status="Up 1 second ($2)"
    printf '{"Id":"%s","Names":["/%s-%s-1"],"State":"%s","Status":"%s","Labels":{"com.docker.compose.project":"%s","com.docker.compose.service":"%s","com.docker.compose.oneoff":"False"}}' \
      "$(date +%s%N)" "$project" "$s" "$1" "$status" "$project" "$s"
  done
  printf ']\n'
}

case "$sub" in
  pull | up | logs | down | ps) daemon_down ;;
esac

case "$sub" in
  pull)
    # PULL_HANG: a registry that never answers; the pid goes to pull.pid for the test to find.
    if [ -n "$PULL_HANG" ]; then echo $$ >"$here/pull.pid"; exec sleep "$PULL_HANG"; fi
    [ -n "$PULL_FAIL" ] && { printf '%s\n' "$PULL_FAIL" >&2; exit 18; }
    echo "web Pulled" >&2
    ;;
  up)
    [ -n "$UP_FAIL" ] && { printf '%s\n' "$UP_FAIL" >&2; exit 1; }
    health=${HEALTH-healthy}
    # UNHEALTHY_IF: releases whose compose file mentions this text never become healthy.
    [ -n "$UNHEALTHY_IF" ] && grep -q "$UNHEALTHY_IF" "$file" && health=unhealthy
    containers running "$health" >"$here/containers.json.tmp"
    mv "$here/containers.json.tmp" "$here/containers.json"
    ;;
  config)
    # REAL_COMPOSE: the real docker CLI builds the model (config only; nothing else is real).
    if [ -n "$REAL_COMPOSE" ]; then exec "$REAL_COMPOSE" compose "${compose_args[@]}"; fi
    if [ -n "$CONFIG_FILE" ]; then cat "$CONFIG_FILE"; else echo "{\"name\":\"$project\",\"services\":{\"web\":{\"image\":\"x\"}}}"; fi
    ;;
  logs)
    if [ -n "$LOGS_FILE" ]; then cat "$LOGS_FILE"; else echo "web-1  | ready"; fi
    ;;
  down)
    # DOWN_FAIL_QUOTING_ENV: fail as compose does on a bad .env, quoting its lines.
    if [ -n "$DOWN_FAIL_QUOTING_ENV" ]; then
      sed 's/^/failed to read .env: /' "$envfile" >&2
      exit 1
    fi
    echo '[]' >"$here/containers.json"
    ;;
  ps) echo '[]' ;;
  *) echo "stub compose: unexpected subcommand: $sub" >&2; exit 99 ;;
esac
exit 0
