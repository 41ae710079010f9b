#!/bin/bash
# The recording stand-in for `docker` (and, installed under that name, a standalone
# `docker-compose`) in the tests, the demo's fast mode and the apply benchmark. monky-compose's
# `testkit` writes it out with `StubDocker`; see that type for the scenario variables.
#
# The driver gives its children a minimal environment, so the scenario is read from `stub.env`
# beside this script, never from the environment. Every call is appended to $STUB_LOG (default
# calls.log beside the script) as `@@` records, one a line: CALL (program), CWD, ARG (each
# argument), ENV (each exported variable), END. The engine's containers are modelled in
# containers.json beside the script (Engine API shape), which the testkit's fake engine serves.
#
# The benchmark counts this script's CPU as the agent's children, so a call costs one bash and
# nothing more: only builtins run here (no `$(...)`, no pipeline, no date/cat/sed/grep), except
# in the hang scenarios, which sleep.
case $0 in
  */*) here=${0%/*} ;;
  *) here=. ;;
esac
[[ $here == /* ]] || here=$PWD/$here
me=${0##*/}
# shellcheck source=/dev/null
[ -f "$here/stub.env" ] && . "$here/stub.env"

{
  printf '@@CALL %s\n@@CWD %s\n' "$me" "$PWD"
  (($#)) && printf '@@ARG %s\n' "$@"
  # Every variable name, by its first character; exported ones are the child's environment.
  for _n in "${!A@}" "${!B@}" "${!C@}" "${!D@}" "${!E@}" "${!F@}" "${!G@}" "${!H@}" "${!I@}" \
    "${!J@}" "${!K@}" "${!L@}" "${!M@}" "${!N@}" "${!O@}" "${!P@}" "${!Q@}" "${!R@}" "${!S@}" \
    "${!T@}" "${!U@}" "${!V@}" "${!W@}" "${!X@}" "${!Y@}" "${!Z@}" "${!_@}" "${!a@}" "${!b@}" \
    "${!c@}" "${!d@}" "${!e@}" "${!f@}" "${!g@}" "${!h@}" "${!i@}" "${!j@}" "${!k@}" "${!l@}" \
    "${!m@}" "${!n@}" "${!o@}" "${!p@}" "${!q@}" "${!r@}" "${!s@}" "${!t@}" "${!u@}" "${!v@}" \
    "${!w@}" "${!x@}" "${!y@}" "${!z@}"; do
    [[ ${!_n@a} == *x* ]] && printf '@@ENV %s=%s\n' "$_n" "${!_n}"
  done
  printf '@@END\n'
} >>"${STUB_LOG:-$here/calls.log}"

emit() { # emit FILE: copies a canned output file to stdout
  [ -n "$1" ] || return 0
  local text
  IFS= read -r -d '' text <"$1"
  printf '%s' "$text"
}

# DAEMON_DOWN: the CLI works but every call that needs the engine fails the way docker's does.
daemon_down() {
  [ -n "$DAEMON_DOWN" ] || return 0
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
  exit 1
}

if [ "$me" = docker-compose ]; then
  version=$STANDALONE_VERSION
else
  case "$1" in
    compose)
      shift
      # COMPOSE_VERSION: the plugin's version (2.32.0 when unset); empty or NO_COMPOSE: no plugin.
      version=${COMPOSE_VERSION-2.32.0}
      if [ -z "$version" ] || [ -n "$NO_COMPOSE" ]; then
        echo "docker: 'compose' is not a docker command." >&2
        echo "See 'docker --help'" >&2
        exit 1
      fi
      ;;
    info)
      daemon_down
      [ -n "$INFO_EXIT" ] && { echo "Cannot connect to the Docker daemon" >&2; exit "$INFO_EXIT"; }
      echo "{\"ServerVersion\":\"${SERVER_VERSION:-28.3.0}\",\"DockerRootDir\":\"${DATA_ROOT:-$here}\"}"
      exit 0
      ;;
    ps)
      daemon_down
      # DOCKER_PS_SEQ: one canned file per call, the last one repeating; none: no container.
      n=0
      [ -f "$here/ps.count" ] && read -r n <"$here/ps.count"
      echo $((n + 1)) >"$here/ps.count"
      read -r -a files <<<"$DOCKER_PS_SEQ"
      [ ${#files[@]} -eq 0 ] && exit 0
      last=$((${#files[@]} - 1))
      [ "$n" -gt "$last" ] && n=$last
      emit "${files[$n]}"
      exit 0
      ;;
    image)
      daemon_down
      echo "Total reclaimed space: 0B"
      exit 0
      ;;
    rm)
      # The model is rewritten by the next `up`; removing records the call and nothing else.
      daemon_down
      shift
      printf '%s\n' "$@"
      exit 0
      ;;
    *)
      echo "stub docker: unexpected arguments: $*" >&2
      exit 99
      ;;
  esac
fi

if [ "$1" = version ]; then
  case "$version" in
    1.*) echo "docker-compose version $version, build unknown"; echo "docker-py version: 5.0.3" ;;
    *) echo "Docker Compose version v$version" ;;
  esac
  exit 0
fi
compose_args=("$@")

# compose's global flags, then the subcommand
project=
file=
envfile=
while [ $# -gt 0 ]; do
  case "$1" in
    -p) project=$2; shift 2 ;;
    # The project's own compose file is the first -f; a later one is the agent's override.
    -f) [ -n "$file" ] || file=$2; shift 2 ;;
    --env-file) envfile=$2; shift 2 ;;
    --ansi | --project-directory | --profile) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
sub=$1
shift

# The compose file's text, read only for the scenarios that look into it: bash's `read` takes
# a large file slowly, and the benchmark's large bundles pad this file.
compose_text=
if [ -n "$FAULT_IF$UNHEALTHY_IF" ] && [ -n "$file" ] && [ -f "$file" ]; then
  IFS= read -r -d '' compose_text <"$file"
fi

# FAULT_IF: the failures below hit only a compose file that contains this text (one release),
# so that another release (the one fallen back to) still comes up.
if [ -n "$FAULT_IF" ] && [[ $compose_text != *"$FAULT_IF"* ]]; then
  PULL_FAIL='' UP_FAIL='' HEALTH=healthy
fi

# HANG: this subcommand never returns (a grandchild too, its pid in grandchild.pid).
if [ "$HANG" = "$sub" ]; then
  sleep 300 &
  echo $! >"$here/grandchild.pid"
  echo "hanging in $sub" >&2
  sleep 300
fi

containers() { # containers STATE HEALTH: the model, one container per service in $SERVICES
  local first=1 s status json='[' id=${EPOCHREALTIME/./}
  for s in ${SERVICES:-web}; do
    [ $first = 1 ] || json+=','
    first=0
    status="Up 1 second"
    [ -n "$2" ] && status="Up 1 second ($2)"
    json+="{\"Id\":\"$id$s\",\"Names\":[\"/$project-$s-1\"],\"State\":\"$1\",\"Status\":\"$status\",\"Labels\":{\"com.docker.compose.project\":\"$project\",\"com.docker.compose.service\":\"$s\",\"com.docker.compose.oneoff\":\"False\",\"com.docker.compose.config-hash\":\"hash-$s\"},\"ImageID\":\"sha256:image-$s\"}"
  done
  # One write; the fake engine re-reads a file it finds half written.
  printf '%s]\n' "$json" >"$here/containers.json"
}

case "$sub" in
  pull | up | logs | down | ps) daemon_down ;;
esac

case "$sub" in
  pull)
    # PULL_HANG: a registry that never answers; the pid goes to pull.pid for the test to find.
    if [ -n "$PULL_HANG" ]; then echo $$ >"$here/pull.pid"; exec sleep "$PULL_HANG"; fi
    [ -n "$PULL_FAIL" ] && { printf '%s\n' "$PULL_FAIL" >&2; exit 18; }
    # PULL_OUTPUT, PULL_EXIT: canned stderr and exit status (a failure says nothing unless told).
    if [ -n "$PULL_OUTPUT" ]; then
      emit "$PULL_OUTPUT" >&2
    elif [ "${PULL_EXIT:-0}" = 0 ]; then
      echo "web Pulled" >&2
    fi
    exit "${PULL_EXIT:-0}"
    ;;
  up)
    # UP_SLEEP: `up` takes this many seconds, its start and end (a SIGTERM ends it) recorded in
    # up.log as `start <pid>` and `end <pid>`; a SIGKILL leaves no end.
    if [ -n "$UP_SLEEP" ]; then
      trap 'echo "end $$" >>"$here/up.log"; exit 143' TERM
      echo "start $$" >>"$here/up.log"
      sleep "$UP_SLEEP" &
      wait $!
      echo "end $$" >>"$here/up.log"
    elif [ -f "$here/up.log" ]; then
      echo "start $$" >>"$here/up.log"
      echo "end $$" >>"$here/up.log"
    fi
    [ -n "$UP_FAIL" ] && { printf '%s\n' "$UP_FAIL" >&2; exit 1; }
    emit "$UP_OUTPUT" >&2
    health=${HEALTH-healthy}
    # UNHEALTHY_IF: releases whose compose file mentions this text never become healthy.
    [ -n "$UNHEALTHY_IF" ] && [[ $compose_text == *"$UNHEALTHY_IF"* ]] && health=unhealthy
    containers running "$health"
    exit "${UP_EXIT:-0}"
    ;;
  ps)
    # STUB_DATA: canned `compose ps` output in the version's format; none: no container.
    if [ -z "$STUB_DATA" ]; then
      echo '[]'
    else
      IFS=. read -r major minor _ <<<"$version"
      if [ "$major" -eq 2 ] && [ "$minor" -lt 21 ]; then
        emit "$STUB_DATA/ps-2.20-array.json"
      else
        emit "$STUB_DATA/ps-2.30-lines.jsonl"
      fi
    fi
    ;;
  logs)
    if [ -n "$LOGS_FILE" ]; then
      emit "$LOGS_FILE"
    elif [ -n "$LOGS_LINES" ]; then
      eval "printf 'web-1  | line %s\n' {1..$((LOGS_LINES))}"
    else
      echo "web-1  | ready"
    fi
    [ -n "$LOGS_STDERR" ] && printf '%s\n' "$LOGS_STDERR" >&2
    ;;
  down)
    # DOWN_FAIL_QUOTING_ENV: fail as compose does on a bad .env, quoting its lines.
    if [ -n "$DOWN_FAIL_QUOTING_ENV" ]; then
      while IFS= read -r line || [ -n "$line" ]; do
        printf 'failed to read .env: %s\n' "$line"
      done <"$envfile" >&2
      exit 1
    fi
    echo '[]' >"$here/containers.json"
    ;;
  config)
    # REAL_COMPOSE: the real docker CLI builds the model (config only; nothing else is real).
    if [ -n "$REAL_COMPOSE" ]; then exec "$REAL_COMPOSE" compose "${compose_args[@]}"; fi
    # CONFIG_OUTPUT: compose's model; else a one-service model of the project, with the pids
    # and memory limits and the logging the agent's override supplies.
    if [ -n "$CONFIG_OUTPUT" ]; then
      emit "$CONFIG_OUTPUT"
    else
      echo "{\"name\":\"$project\",\"services\":{\"web\":{\"image\":\"x\",\"pids_limit\":1024,\"mem_limit\":\"2147483648\",\"logging\":{\"driver\":\"json-file\",\"options\":{\"max-size\":\"10485760\",\"max-file\":\"3\"}}}}}"
    fi
    [ -n "$CONFIG_EXIT" ] && { echo "service \"web\" refers to undefined network backend: invalid compose project" >&2; exit "$CONFIG_EXIT"; }
    ;;
  *)
    echo "stub compose: unexpected subcommand: $sub" >&2
    exit 99
    ;;
esac
exit 0
