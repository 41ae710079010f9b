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

[ "$1" = compose ] || {
  case "$1" in
    image) echo "Total reclaimed space: 0B"; exit 0 ;;
    info) echo "{\"ServerVersion\":\"28.3.0\",\"DockerRootDir\":\"$here\"}"; exit 0 ;;
    *) echo "stub docker: unexpected: $*" >&2; exit 99 ;;
  esac
}
shift
[ "$1" = version ] && { echo "Docker Compose version v${COMPOSE_VERSION:-2.32.0}"; exit 0; }

project=
while [ $# -gt 0 ]; do
  case "$1" in
    -p) project=$2; shift 2 ;;
    -f | --env-file | --ansi | --project-directory) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
sub=$1
shift

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
  pull)
    [ -n "$PULL_FAIL" ] && { printf '%s\n' "$PULL_FAIL" >&2; exit 18; }
    echo "web Pulled" >&2
    ;;
  up)
    [ -n "$UP_FAIL" ] && { printf '%s\n' "$UP_FAIL" >&2; exit 1; }
    containers running "${HEALTH-healthy}" >"$here/containers.json.tmp"
    mv "$here/containers.json.tmp" "$here/containers.json"
    ;;
  config)
    if [ -n "$CONFIG_FILE" ]; then cat "$CONFIG_FILE"; else echo '{"name":"x","services":{"web":{"image":"x"}}}'; fi
    ;;
  logs)
    if [ -n "$LOGS_FILE" ]; then cat "$LOGS_FILE"; else echo "web-1  | ready"; fi
    ;;
  down)
    echo '[]' >"$here/containers.json"
    ;;
  ps) echo '[]' ;;
  *) echo "stub compose: unexpected subcommand: $sub" >&2; exit 99 ;;
esac
exit 0
