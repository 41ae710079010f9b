#!/usr/bin/env bash
# install.sh: puts monky-deployd on a box and makes it tick.
#
#   T=<read-only download token, from the install kit>
#   curl -sSf -H "DEPLOY-TOKEN: $T" <gitlab>/monky-deployd/<version>/install.sh \
#     | sudo bash -s -- --env env-qa-02 --site cbs --token "$T" --bootstrap-file bootstrap.jwt \
#       [--enrol-jwt monky-host.env-qa-02.jwt] [--transport proxy|system|sdk] [--version X.Y.Z] \
#       [--docker-data-root DIR] [--userns-remap] [--laptop] [--bao-ca openbao-ca.pem] \
#       [--source gitlab|gitea|URL|DIR] [--ziti-apt-source LINE] [--dry-run]
#
# Every command line of the original agent's kit (0.1.0 to 0.1.7) works unchanged: the grant on
# stdin of a script run from a file (0.1.0), `--transport sdk` (carried onto proxy: this agent
# has no SDK), and `--version` of an original release (this script installs its own).
#
# What it does, in order: download the .deb and its .sha256 and check one against the other;
# install what the mesh needs from OpenZiti's apt suite (the tunneler, and the `ziti` CLI for
# the proxy) and the compose plugin when absent; apt-get install the .deb; optionally point
# docker at another data root and, with --userns-remap, make it remap user namespaces (its
# daemon.json merged, the file checked by dockerd before the restart, restored if it fails); enrol the box's mesh identity when a fresh enrolment JWT is given,
# switch the tunneler to run-host and let the agent read the identity; write
# /etc/monky-deployd/config.yaml; stage the bootstrap grant (0600, owned by the agent); enable the
# proxy (transport proxy) and the timer (not in laptop mode, which runs the loop by hand); run one
# tick and end with its real outcome and `monky-deployd doctor`'s verdict.
# --dry-run prints every action instead of doing it, and needs no root.
#
# Secrets: the download token is sent to curl on stdin (never in argv, never printed) and the
# grant is copied file to file; neither is echoed, in a dry run either.
set -euo pipefail
umask 077

DEFAULT_VERSION="0.2.0"
CONFIG_DIR=/etc/monky-deployd
STATE_DIR=/var/lib/monky-deployd
IDENTITY_DIR=/opt/openziti/etc/identities
# Overridable so the dry-run tests do not depend on the docker setup of the machine running them.
DOCKER_DAEMON_JSON=${MONKY_DEPLOYD_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
# The release downloads, built in as the original kit had them: the GitLab project's generic
# package registry (the default; the project is private, so it takes the kit's deploy token) and
# the public Gitea mirror. The version is appended (`<base>/<version>/`, `<base>/v<version>/`).
GITLAB_URL=${MONKY_DEPLOYD_GITLAB_URL:-https://scm.tikali.ai/api/v4/projects/69/packages/generic/monky-deployd}
GITEA_URL=${MONKY_DEPLOYD_GITEA_URL:-https://gitea.cbs.tikali.net/mdella/monky-deployd/releases/download}
# The apt source line of OpenZiti's suite, added when the tunneler or the ziti CLI is missing and
# apt does not know them yet (a box that had the original agent already has the suite).
ZITI_APT_SOURCE=${MONKY_DEPLOYD_ZITI_APT_SOURCE:-}
ZITI_APT_LIST=/etc/apt/sources.list.d/openziti.list
TUNNELER_DROPIN=/etc/systemd/system/ziti-edge-tunnel.service.d/run-host.conf

ENV_ID=""
SITE="cbs"
TOKEN="${MONKY_DEPLOYD_TOKEN:-}"
BOOTSTRAP_FILE=""
ENROL_JWT=""
TRANSPORT="proxy"
VERSION="$DEFAULT_VERSION"
DOCKER_DATA_ROOT=""
USERNS_REMAP=false
LAPTOP=false
BAO_CA=""
SOURCE="gitlab"
DRY_RUN=false

usage() {
    cat <<'EOF'
usage: sudo bash install.sh --env ENV [options]

Installs monky-deployd and what the mesh needs, writes its config, stages the bootstrap grant,
enables the timer and runs one tick; ends with that tick's outcome and the doctor's verdict.

Options:
  --env ENV                backend environment this box hosts (required)
  --site SITE              site name, also the OpenBao host bao.SITE.tikali.net (default cbs)
  --token TOKEN            read-only download token (or MONKY_DEPLOYD_TOKEN)
  --bootstrap-file FILE    the kit's one-time deploy grant ("-" reads it from stdin; so does
                           a script run from a file with the grant on stdin)
  --enrol-jwt FILE         enrol monky-host.ENV with this JWT when the identity is missing
  --transport T            proxy (default) or system; sdk, the original agent's default, is
                           carried onto proxy with the same identity
  --version VERSION        package version to install (default the script's own; an original
                           agent's 0.1.x means the script's own)
  --docker-data-root DIR   make docker keep its data in DIR (merged into daemon.json)
  --userns-remap           make docker remap user namespaces ("userns-remap": "default"
                           merged into daemon.json, docker restarted): a container's uid is
                           then no host account's. Images and volumes start afresh in a new
                           data dir, and bind-mounted files must be owned by the subordinate
                           range (see docs/compose-policy.md)
  --laptop                 laptop mode: offline ticks exit 0; no timer, run `monky-deployd run`
  --bao-ca FILE            PEM that becomes the only trust root for OpenBao
  --source S               gitlab (default, with --token), gitea, an https URL, or a local
                           folder with the release files
  --ziti-apt-source LINE   the apt source line of OpenZiti's suite, when apt does not know
                           ziti-edge-tunnel yet (or MONKY_DEPLOYD_ZITI_APT_SOURCE)
  --dry-run                print every action, change nothing
EOF
}

die() {
    echo "install.sh: $*" >&2
    exit 1
}

say() {
    echo "==> $*"
}

# Runs a command, or prints it in a dry run. Arguments are printed shell-quoted.
run() {
    if $DRY_RUN; then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

# Writes stdin to PATH with MODE and OWNER:GROUP, atomically. A dry run prints the content, or
# only NOTE instead when one is given (secrets, copies of files).
put() {
    local path=$1 mode=$2 owner=$3 note=${4:-}
    if $DRY_RUN; then
        echo "+ write $path (mode $mode, owner $owner)"
        if [ -n "$note" ]; then
            cat >/dev/null
            echo "    ($note)"
        else
            echo "--- $path"
            cat
            echo "--- end of $path"
        fi
        return
    fi
    local tmp
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    chown "$owner" "$tmp"
    mv -f "$tmp" "$path"
}

need_value() {
    if [ $# -lt 2 ] || [ -z "$2" ]; then
        die "$1 needs a value (try --help)"
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
    --env) need_value "$@"; ENV_ID=$2; shift 2 ;;
    --site) need_value "$@"; SITE=$2; shift 2 ;;
    --token) need_value "$@"; TOKEN=$2; shift 2 ;;
    --bootstrap-file) need_value "$@"; BOOTSTRAP_FILE=$2; shift 2 ;;
    --enrol-jwt) need_value "$@"; ENROL_JWT=$2; shift 2 ;;
    --transport) need_value "$@"; TRANSPORT=$2; shift 2 ;;
    --version) need_value "$@"; VERSION=$2; shift 2 ;;
    --docker-data-root) need_value "$@"; DOCKER_DATA_ROOT=$2; shift 2 ;;
    --userns-remap) USERNS_REMAP=true; shift ;;
    --laptop) LAPTOP=true; shift ;;
    --bao-ca) need_value "$@"; BAO_CA=$2; shift 2 ;;
    --source) need_value "$@"; SOURCE=$2; shift 2 ;;
    --ziti-apt-source) need_value "$@"; ZITI_APT_SOURCE=$2; shift 2 ;;
    --dry-run) DRY_RUN=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
done

# ---- checks before anything changes ----------------------------------------------------------

# Names end up in YAML, file names and unit arguments: letters, digits, '-' and '_' only.
is_name() {
    [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_-]*$ ]]
}

[ -n "$ENV_ID" ] || die "--env is required (the backend environment, e.g. env-qa-02)"
is_name "$ENV_ID" || die "--env '$ENV_ID': use letters, digits, '-' and '_' only"
is_name "$SITE" || die "--site '$SITE': use letters, digits, '-' and '_' only"
case "$TRANSPORT" in
proxy | system) ;;
sdk)
    # The original agent's default dialled with the SDK; the same identity through
    # `ziti tunnel proxy` reaches the same services.
    echo "==> --transport sdk: this agent has no OpenZiti SDK; using proxy with the same identity"
    TRANSPORT=proxy
    ;;
*) die "--transport '$TRANSPORT': use proxy or system (or sdk, which means proxy)" ;;
esac
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+([~+.][A-Za-z0-9.~+]+)?(-[A-Za-z0-9.~+]+)?$ ]] ||
    die "--version '$VERSION' is not a version like 0.2.0"
# The original kit pins its own release; a 0.1.x package is the original agent, which this
# script does not set up.
if [[ $VERSION =~ ^0\.1\. ]]; then
    echo "==> --version $VERSION is the original agent's; installing $DEFAULT_VERSION"
    VERSION=$DEFAULT_VERSION
fi
if [ -z "$BOOTSTRAP_FILE" ] && [ -n "${BASH_SOURCE[0]:-}" ] && [ -f "${BASH_SOURCE[0]}" ] &&
    { [ -p /dev/stdin ] || [ -f /dev/stdin ]; }; then
    # The 0.1.0 kit ran the script from a file with the grant on stdin. Only then is stdin the
    # grant: under `curl ... | bash -s` it is the rest of this script.
    BOOTSTRAP_FILE=-
fi
if [ -n "$BOOTSTRAP_FILE" ] && [ "$BOOTSTRAP_FILE" != - ]; then
    [ -s "$BOOTSTRAP_FILE" ] || die "--bootstrap-file $BOOTSTRAP_FILE is missing or empty"
fi
if [ -n "$ENROL_JWT" ]; then
    [ -s "$ENROL_JWT" ] || die "--enrol-jwt $ENROL_JWT is missing or empty"
fi
if [ -n "$BAO_CA" ]; then
    grep -q 'BEGIN CERTIFICATE' "$BAO_CA" 2>/dev/null ||
        die "--bao-ca $BAO_CA is not a PEM certificate file"
fi
if [ -n "$DOCKER_DATA_ROOT" ]; then
    [[ $DOCKER_DATA_ROOT == /* ]] || die "--docker-data-root must be an absolute path"
    [[ $DOCKER_DATA_ROOT =~ ^[A-Za-z0-9/._-]+$ ]] ||
        die "--docker-data-root: letters, digits and / . _ - only"
fi
if ! $DRY_RUN && [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo bash install.sh ...), or add --dry-run to see what it would do"
fi

# The release files are named as `cargo xtask dist` (and the original packaging) name them:
# monky-deployd_<version>_<arch>.deb, no Debian revision.
DEB_VERSION=$VERSION
UPSTREAM_VERSION=${VERSION%-*}
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
DEB="monky-deployd_${DEB_VERSION}_${ARCH}.deb"
IDENTITY="$IDENTITY_DIR/monky-host.$ENV_ID.json"

# ---- 1. the download ---------------------------------------------------------------------------

WORK=""
cleanup() {
    if [ -n "$WORK" ]; then
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# Where the release files are: a local folder, or a URL prefix to which the file name is added.
release_base() {
    case "$SOURCE" in
    gitlab) echo "${GITLAB_URL%/}/$UPSTREAM_VERSION" ;;
    gitea) echo "${GITEA_URL%/}/v$UPSTREAM_VERSION" ;;
    https://* | http://*) echo "${SOURCE%/}" ;;
    *)
        [ -d "$SOURCE" ] || die "--source '$SOURCE' is not gitlab, gitea, a URL or a folder"
        (cd "$SOURCE" && pwd)
        ;;
    esac
}

fetch() {
    local base=$1 name=$2 dest=$3
    if [ -d "$base" ]; then
        run cp "$base/$name" "$dest/$name"
        return
    fi
    if $DRY_RUN; then
        if [ -n "$TOKEN" ]; then
            echo "+ curl -fsSL --config - $base/$name -o $dest/$name   (DEPLOY-TOKEN header from --token, on stdin)"
        else
            echo "+ curl -fsSL $base/$name -o $dest/$name"
        fi
        return
    fi
    if [ -n "$TOKEN" ]; then
        printf 'header = "DEPLOY-TOKEN: %s"\n' "$TOKEN" |
            curl -fsSL --config - "$base/$name" -o "$dest/$name"
    else
        curl -fsSL "$base/$name" -o "$dest/$name"
    fi
}

BASE=$(release_base)
if $DRY_RUN; then
    WORK=/tmp/monky-deployd-install.XXXXXX
else
    WORK=$(mktemp -d /tmp/monky-deployd-install.XXXXXX)
    chmod 0755 "$WORK" # apt's unprivileged download user reads the .deb from here
fi
say "downloading $DEB and $DEB.sha256 from $BASE"
fetch "$BASE" "$DEB" "$WORK"
fetch "$BASE" "$DEB.sha256" "$WORK"

say "checking the sha256 of $DEB"
if $DRY_RUN; then
    echo "+ (cd $WORK && sha256sum --check --strict $DEB.sha256)"
else
    # The checksum file must name exactly this package: `sha256sum -c` alone would accept a file
    # listing some other name that happens to be present.
    read -r _ named <"$WORK/$DEB.sha256" || die "$DEB.sha256 is empty"
    [ "${named#\*}" = "$DEB" ] || die "$DEB.sha256 names '$named', not $DEB: refusing to install"
    (cd "$WORK" && sha256sum --check --strict --quiet "$DEB.sha256") ||
        die "$DEB does not match $DEB.sha256: refusing to install"
fi

# ---- 2. what the mesh needs: OpenZiti's tunneler and CLI, and the compose plugin ----------------

# Whether apt can install PACKAGE (it knows a candidate version). The output is read whole: a
# `grep -q` that stops early would fail the pipeline under pipefail.
apt_knows() {
    local policy
    policy=$(apt-cache policy "$1" 2>/dev/null) || return 1
    [[ $policy =~ Candidate:\ [^\(] ]]
}

MESH_PKGS=()
command -v ziti-edge-tunnel >/dev/null || MESH_PKGS+=(ziti-edge-tunnel)
# The agent reads the identity through an ACL, as the tunneler keeps owning it.
command -v setfacl >/dev/null || MESH_PKGS+=(acl)
if [ "$TRANSPORT" = proxy ] && ! command -v ziti >/dev/null; then
    # `ziti tunnel proxy` (monky-deployd-proxy.service) is OpenZiti's CLI, package openziti.
    MESH_PKGS+=(openziti)
fi
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    MESH_PKGS+=(docker-compose-plugin)
fi
if [ ${#MESH_PKGS[@]} -gt 0 ]; then
    say "installing ${MESH_PKGS[*]}"
    if [ -n "$ZITI_APT_SOURCE" ]; then
        printf '%s\n' "$ZITI_APT_SOURCE" | put "$ZITI_APT_LIST" 0644 root:root
        # Only the suite just added is refreshed: the box's other sources stay as they were.
        run env DEBIAN_FRONTEND=noninteractive apt-get update -q \
            -o Dir::Etc::sourcelist="$ZITI_APT_LIST" -o Dir::Etc::sourceparts=- \
            -o APT::Get::List-Cleanup=0
    else
        run env DEBIAN_FRONTEND=noninteractive apt-get update -q
    fi
    if ! $DRY_RUN; then
        for pkg in "${MESH_PKGS[@]}"; do
            apt_knows "$pkg" || die "apt cannot install $pkg: add OpenZiti's apt suite \
(--ziti-apt-source 'deb [signed-by=KEYRING] URL SUITE main', see docs/OPERATIONS.md) and re-run; nothing of monky-deployd was installed"
        done
    fi
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${MESH_PKGS[@]}"
fi

# ---- 3. the package ------------------------------------------------------------------------------

say "installing $DEB"
run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$WORK/$DEB"

# ---- 4. docker's data root ----------------------------------------------------------------------

if [ -n "$DOCKER_DATA_ROOT" ]; then
    say "docker data root: $DOCKER_DATA_ROOT"
    run install -d -m 0711 "$DOCKER_DATA_ROOT"
    if [ -e "$DOCKER_DAEMON_JSON" ]; then
        # The operator's file keeps every other key; only data-root is set. JSON is merged by a
        # JSON parser, never by text edits.
        command -v python3 >/dev/null ||
            die "merging data-root into $DOCKER_DAEMON_JSON needs python3; add \"data-root\": \"$DOCKER_DATA_ROOT\" by hand"
        merged=$(python3 -c '
import json, sys
with open(sys.argv[1]) as f:
    doc = json.load(f)
if not isinstance(doc, dict):
    sys.exit("not a JSON object")
doc["data-root"] = sys.argv[2]
print(json.dumps(doc, indent=2))
' "$DOCKER_DAEMON_JSON" "$DOCKER_DATA_ROOT") ||
            die "$DOCKER_DAEMON_JSON is not a JSON object: fix it, or add \"data-root\" by hand"
        printf '%s\n' "$merged" | put "$DOCKER_DAEMON_JSON" 0644 root:root
    else
        run install -d -m 0755 "$(dirname "$DOCKER_DAEMON_JSON")"
        printf '{\n  "data-root": "%s"\n}\n' "$DOCKER_DATA_ROOT" | put "$DOCKER_DAEMON_JSON" 0644 root:root
    fi
    # With --userns-remap, the one restart comes below, checked.
    $USERNS_REMAP || run systemctl restart docker.service
fi

# ---- 4b. user namespace remapping (--userns-remap) ---------------------------------------------

# Without it a container's uid is the host's: the host account with that uid reads the
# container's /proc/<pid>/environ and files, and shares its per-user kernel limits. "default"
# makes dockerd create the dockremap account and its subordinate uid/gid ranges.
if $USERNS_REMAP; then
    say "docker: userns-remap"
    command -v python3 >/dev/null ||
        die "merging userns-remap into $DOCKER_DAEMON_JSON needs python3; add \"userns-remap\": \"default\" by hand"
    # The operator's keys stay, a userns-remap already set included; JSON is merged by a JSON
    # parser. In a dry run after --docker-data-root the file is not written yet: data-root is
    # merged here again, so the printed file is the one that would be written.
    merged=$(python3 -c '
import json, os, sys
path, data_root = sys.argv[1], sys.argv[2]
doc = {}
if os.path.exists(path):
    with open(path) as f:
        doc = json.load(f)
if not isinstance(doc, dict):
    sys.exit("not a JSON object")
if data_root:
    doc["data-root"] = data_root
if doc.get("userns-remap", "") not in ("", "default"):
    print("install.sh: keeping the userns-remap " + json.dumps(doc["userns-remap"]) + " already set", file=sys.stderr)
else:
    doc["userns-remap"] = "default"
print(json.dumps(doc, indent=2))
' "$DOCKER_DAEMON_JSON" "$DOCKER_DATA_ROOT") ||
        die "$DOCKER_DAEMON_JSON is not a JSON object: fix it, or add \"userns-remap\" by hand"
    # dockerd checks the merged file before it replaces the running one (docker 23 and later
    # know --validate); a file it refuses is never written.
    if $DRY_RUN; then
        echo "+ dockerd --validate --config-file <the merged $DOCKER_DAEMON_JSON>"
    elif dockerd --help 2>/dev/null | grep -q -- '--validate'; then
        candidate=$(mktemp)
        printf '%s\n' "$merged" >"$candidate"
        dockerd --validate --config-file "$candidate" >/dev/null ||
            { rm -f "$candidate"; die "dockerd refuses the merged $DOCKER_DAEMON_JSON; nothing was changed"; }
        rm -f "$candidate"
    fi
    previous=""
    if [ -e "$DOCKER_DAEMON_JSON" ]; then
        previous="$DOCKER_DAEMON_JSON.before-monky-deployd"
        run cp -p "$DOCKER_DAEMON_JSON" "$previous"
    else
        run install -d -m 0755 "$(dirname "$DOCKER_DAEMON_JSON")"
    fi
    printf '%s\n' "$merged" | put "$DOCKER_DAEMON_JSON" 0644 root:root
    # The restart stops every container (unless live-restore), and with remapping the engine
    # starts from a data dir of its own: the agent's next tick pulls and starts the release
    # again. A daemon that does not come back, or comes back without remapping, gets its
    # previous file back.
    if ! run systemctl restart docker.service ||
        { ! $DRY_RUN && ! docker info --format '{{json .SecurityOptions}}' | grep -q 'name=userns'; }; then
        if [ -n "$previous" ]; then
            cp -p "$previous" "$DOCKER_DAEMON_JSON"
        else
            rm -f "$DOCKER_DAEMON_JSON"
        fi
        systemctl restart docker.service || true
        die "docker did not come back remapping user namespaces; $DOCKER_DAEMON_JSON was restored (journalctl -u docker)"
    fi
    $DRY_RUN && echo "+ docker info --format '{{json .SecurityOptions}}'  # must show name=userns"
fi

# ---- 5. the mesh identity ----------------------------------------------------------------------

if [ -n "$ENROL_JWT" ]; then
    if [ -e "$IDENTITY" ]; then
        say "identity $IDENTITY exists; not enrolling again"
    else
        say "enrolling monky-host.$ENV_ID"
        $DRY_RUN || command -v ziti-edge-tunnel >/dev/null ||
            die "--enrol-jwt needs ziti-edge-tunnel (OpenZiti's tunneler package): install it, then re-run"
        run install -d -m 0755 "$IDENTITY_DIR"
        run ziti-edge-tunnel enroll --jwt "$ENROL_JWT" --identity "$IDENTITY"
    fi
    # An enrolment JWT is single-use and worthless once used, but it is still a credential.
    run rm -f "$ENROL_JWT"
fi
if [ "$TRANSPORT" = proxy ] && { [ -e "$IDENTITY" ] || $DRY_RUN; }; then
    # The proxy dials with the identity itself, so the tunneler only hosts (run-host): in `run`
    # mode it would also intercept the services' names. Laptops on transport system keep `run`.
    if [ ! -e "$TUNNELER_DROPIN" ]; then
        say "switching ziti-edge-tunnel to run-host"
        tunneler=$(command -v ziti-edge-tunnel || echo /opt/openziti/bin/ziti-edge-tunnel)
        run install -d -m 0755 "$(dirname "$TUNNELER_DROPIN")"
        printf '# Written by monky-deployd install.sh: host services only, no intercepts.\n[Service]\nExecStart=\nExecStart=%s run-host --verbose=2 --identity-dir %s\n' \
            "$tunneler" "$IDENTITY_DIR" | put "$TUNNELER_DROPIN" 0644 root:root
    fi
    run systemctl daemon-reload
    run systemctl enable ziti-edge-tunnel.service
    run systemctl restart ziti-edge-tunnel.service
fi
if [ -e "$IDENTITY" ] || { $DRY_RUN && [ -n "$ENROL_JWT" ]; }; then
    say "letting monky-deployd read $IDENTITY"
    run setfacl -m u:monky-deployd:x "$IDENTITY_DIR"
    run setfacl -m u:monky-deployd:r "$IDENTITY"
elif [ "$TRANSPORT" = proxy ]; then
    echo "    warning: $IDENTITY is missing; the proxy cannot start until the box is enrolled (--enrol-jwt)" >&2
fi

# ---- 6. configuration --------------------------------------------------------------------------

say "writing $CONFIG_DIR/config.yaml"
run install -d -o monky-deployd -g monky-deployd -m 0750 "$CONFIG_DIR"
if [ -n "$BAO_CA" ]; then
    put "$CONFIG_DIR/openbao-ca.pem" 0640 root:monky-deployd "copy of $BAO_CA" <"$BAO_CA"
fi
if [ -e "$CONFIG_DIR/config.yaml" ]; then
    run cp -p "$CONFIG_DIR/config.yaml" "$CONFIG_DIR/config.yaml.previous"
fi
{
    cat <<EOF
# Written by install.sh $DEFAULT_VERSION for $ENV_ID. Every key is explained in
# /usr/share/doc/monky-deployd/config.example.yaml; re-running install.sh rewrites this file
# and keeps the previous one as config.yaml.previous.
env_id: $ENV_ID
site: $SITE
transport: $TRANSPORT
identity: $IDENTITY
state_dir: $STATE_DIR
bootstrap_file: $CONFIG_DIR/bootstrap.jwt
laptop_mode: $LAPTOP

tenancy:
  service: monky.tenancy.deploy
  host: monky.tenancy.deploy
  port: 443                          # the service's intercept port, not the in-pod 8081
  scheme: http
  proxy_addr: 127.0.0.1:18443

bao:
  service: openbao
  addr: https://bao.$SITE.tikali.net:8200
  auth_mount: jwt-tenancy
  role: see-env
  proxy_addr: 127.0.0.1:18200
EOF
    if [ -n "$BAO_CA" ]; then
        echo "  ca_bundle: $CONFIG_DIR/openbao-ca.pem"
    fi
} | put "$CONFIG_DIR/config.yaml" 0640 root:monky-deployd

if [ "$TRANSPORT" = proxy ]; then
    printf '# Written by install.sh: the identity monky-deployd-proxy.service dials with.\nMONKY_ZITI_IDENTITY=%s\n' "$IDENTITY" |
        put "$CONFIG_DIR/proxy.env" 0640 root:monky-deployd
fi

# ---- 7. the bootstrap grant --------------------------------------------------------------------

if [ -n "$BOOTSTRAP_FILE" ]; then
    say "staging the bootstrap grant at $CONFIG_DIR/bootstrap.jwt (0600)"
    if [ "$BOOTSTRAP_FILE" = - ]; then
        put "$CONFIG_DIR/bootstrap.jwt" 0600 monky-deployd:monky-deployd "the grant from stdin; a secret, not shown"
    else
        put "$CONFIG_DIR/bootstrap.jwt" 0600 monky-deployd:monky-deployd "the grant from $BOOTSTRAP_FILE; a secret, not shown" <"$BOOTSTRAP_FILE"
    fi
elif ! $DRY_RUN && [ ! -s "$STATE_DIR/bao.token" ]; then
    echo "    warning: no --bootstrap-file and no stored token: the first tick will fail with NO_CREDENTIALS" >&2
fi

# ---- 8. systemd, the first tick, the doctor --------------------------------------------------

run systemctl daemon-reload
if [ "$TRANSPORT" = proxy ]; then
    say "starting the proxy"
    if $DRY_RUN || command -v ziti >/dev/null; then
        run systemctl enable --now monky-deployd-proxy.service
    else
        echo "    warning: no ziti CLI on PATH: monky-deployd-proxy.service stays off until OpenZiti's openziti package is installed" >&2
        run systemctl enable monky-deployd-proxy.service
    fi
fi
if $LAPTOP; then
    # Laptop mode is the loop without the timer: the owner runs `monky-deployd run` when the
    # laptop hosts the env.
    say "laptop mode: the timer stays off; start the loop with: monky-deployd run"
    run systemctl disable --now monky-deployd.timer
else
    say "enabling the timer"
    run systemctl enable --now monky-deployd.timer
fi

say "running one tick"
run systemctl start monky-deployd.service || true
if $DRY_RUN; then
    tick_status=0
else
    tick_status=$(systemctl show -p ExecMainStatus --value monky-deployd.service 2>/dev/null || echo unknown)
fi
say "doctor"
# As the agent's user, so the verdict is about what the agent itself can read and reach.
if run runuser -u monky-deployd -- monky-deployd --config "$CONFIG_DIR/config.yaml" doctor; then
    doctor_ok=true
else
    doctor_ok=false
fi
if $DRY_RUN; then
    say "dry run: nothing was changed"
    exit 0
fi
case "$tick_status" in
0) ;;
75)
    echo "install.sh: installed, but the first tick could not reach tenancy or OpenBao (exit 75, temporary):" >&2
    echo "    this box is not on the mesh yet; fix what the doctor says above, then: journalctl -u monky-deployd -n 50" >&2
    exit 1
    ;;
*)
    echo "install.sh: installed, but the first tick failed (exit $tick_status): journalctl -u monky-deployd -n 50" >&2
    exit 1
    ;;
esac
if ! $doctor_ok; then
    echo "install.sh: the first tick succeeded, but the doctor found a problem (above)" >&2
    exit 1
fi
if $LAPTOP; then
    say "done: monky-deployd $DEB_VERSION ticked once; run \`monky-deployd run\` to keep it converging"
else
    say "done: monky-deployd $DEB_VERSION ticks every minute (journalctl -u monky-deployd -f)"
fi
