#!/bin/bash
# Recording stand-in for `docker` and `docker-compose` in monky-compose's tests.
#
# The driver gives its children a minimal environment, so this stub cannot be steered by
# environment variables: it reads its scenario from `stub.env` beside itself, written by the
# test. Every call is appended to $STUB_LOG: program name, working directory, each argument and
# the complete environment, one `@@` record per line.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/stub.env"
me=$(basename "$0")
{
  echo "@@CALL $me"
  echo "@@CWD $PWD"
  for a in "$@"; do echo "@@ARG $a"; done
  env | sort | sed 's/^/@@ENV /'
  echo "@@END"
} >>"$STUB_LOG"

emit() { # emit FILE: copy a canned output file to stdout
  [ -n "$1" ] && cat "$1"
}

if [ "$me" = docker ]; then
  case "$1" in
    compose)
      shift
      if [ -z "$COMPOSE_VERSION" ]; then
        echo "docker: 'compose' is not a docker command." >&2
        echo "See 'docker --help'" >&2
        exit 1
      fi
      version=$COMPOSE_VERSION
      ;;
    info)
      [ -n "$INFO_EXIT" ] && { echo "Cannot connect to the Docker daemon" >&2; exit "$INFO_EXIT"; }
      echo "{\"ServerVersion\":\"${SERVER_VERSION:-24.0.7}\",\"DockerRootDir\":\"${DATA_ROOT:-/var/lib/docker}\"}"
      exit 0
      ;;
    ps)
      # one canned file per call, the last one repeating
      n=0
      [ -f "$here/ps.count" ] && n=$(cat "$here/ps.count")
      echo $((n + 1)) >"$here/ps.count"
      read -r -a files <<<"$DOCKER_PS_SEQ"
      [ ${#files[@]} -eq 0 ] && exit 0
      last=$((${#files[@]} - 1))
      [ "$n" -gt "$last" ] && n=$last
      emit "${files[$n]}"
      exit 0
      ;;
    image)
      echo "Total reclaimed space: 0B"
      exit 0
      ;;
    *)
      echo "stub docker: unexpected arguments: $*" >&2
      exit 99
      ;;
  esac
else
  version=$STANDALONE_VERSION
fi

if [ "$1" = version ]; then
  case "$version" in
    1.*) echo "docker-compose version $version, build unknown"; echo "docker-py version: 5.0.3" ;;
    *) echo "Docker Compose version v$version" ;;
  esac
  exit 0
fi

# skip compose's global flags to find the subcommand
while [ $# -gt 0 ]; do
  case "$1" in
    --ansi | -p | -f | --env-file | --project-directory | --profile) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
sub=$1
shift

if [ "$HANG" = "$sub" ]; then
  sleep 300 &
  echo $! >"$here/grandchild.pid"
  echo "hanging in $sub" >&2
  sleep 300
fi

case "$sub" in
  pull)
    emit "$PULL_OUTPUT" >&2
    exit "${PULL_EXIT:-0}"
    ;;
  up)
    emit "$UP_OUTPUT" >&2
    exit "${UP_EXIT:-0}"
    ;;
  ps)
    IFS=. read -r major minor _ <<<"$version"
    if [ "$major" -eq 2 ] && [ "$minor" -lt 21 ]; then
      emit "$STUB_DATA/ps-2.20-array.json"
    else
      emit "$STUB_DATA/ps-2.30-lines.jsonl"
    fi
    ;;
  logs)
    if [ -n "$LOGS_LINES" ]; then
      seq 1 "$LOGS_LINES" | sed 's/^/web-1  | line /'
    else
      echo "web-1  | ready"
    fi
    echo "compose warning on stderr" >&2
    ;;
  down) ;;
  config)
    emit "${CONFIG_OUTPUT:-$STUB_DATA/config.json}"
    [ -n "$CONFIG_EXIT" ] && { echo "service \"web\" refers to undefined network backend: invalid compose project" >&2; exit "$CONFIG_EXIT"; }
    ;;
  *)
    echo "stub compose: unexpected subcommand: $sub" >&2
    exit 99
    ;;
esac
exit 0
