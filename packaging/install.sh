#!/usr/bin/env bash
# install.sh: puts monky-deployd on a box and makes it tick.
#
#   sudo bash install.sh --env env-qa-02 --site cbs --bootstrap-file bootstrap.jwt \
#       [--token T] [--enrol-jwt monky-host.env-qa-02.jwt] [--transport proxy|system] \
#       [--version X.Y.Z] [--docker-data-root DIR] [--laptop] [--bao-ca openbao-ca.pem] \
#       [--source gitlab|gitea|URL|DIR] [--dry-run]
#
# What it does, in order: download the .deb and its .sha256 and check one against the other;
# apt-get install the .deb; optionally point docker at another data root; enrol the box's mesh
# identity when a fresh enrolment JWT is given and let the agent read it; write
# /etc/monky-deployd/config.yaml; stage the bootstrap grant (0600, owned by the agent); enable
# the proxy (transport proxy) and the timer; run one tick and show `monky-deployd status`.
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

ENV_ID=""
SITE="cbs"
TOKEN="${MONKY_DEPLOYD_TOKEN:-}"
BOOTSTRAP_FILE=""
ENROL_JWT=""
TRANSPORT="proxy"
VERSION="$DEFAULT_VERSION"
DOCKER_DATA_ROOT=""
LAPTOP=false
BAO_CA=""
SOURCE="gitlab"
DRY_RUN=false

usage() {
    cat <<'EOF'
usage: sudo bash install.sh --env ENV [options]

Installs monky-deployd, writes its config, stages the bootstrap grant, enables the timer and
runs one tick.

Options:
  --env ENV                backend environment this box hosts (required)
  --site SITE              site name, also the OpenBao host bao.SITE.tikali.net (default cbs)
  --token TOKEN            read-only download token (or MONKY_DEPLOYD_TOKEN)
  --bootstrap-file FILE    the kit's one-time deploy grant ("-" reads it from stdin)
  --enrol-jwt FILE         enrol monky-host.ENV with this JWT when the identity is missing
  --transport T            proxy (default) or system; sdk is not available in this build
  --version VERSION        package version to install (default the script's own)
  --docker-data-root DIR   make docker keep its data in DIR (only on a box without daemon.json)
  --laptop                 laptop mode: offline ticks exit 0 quietly
  --bao-ca FILE            PEM that becomes the only trust root for OpenBao
  --source S               gitlab (default), gitea, an https URL, or a local folder with the
                           release files; gitlab/gitea read MONKY_DEPLOYD_GITLAB_URL or
                           MONKY_DEPLOYD_GITEA_URL
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
    --laptop) LAPTOP=true; shift ;;
    --bao-ca) need_value "$@"; BAO_CA=$2; shift 2 ;;
    --source) need_value "$@"; SOURCE=$2; shift 2 ;;
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
sdk) die "--transport sdk is not available in this build (no OpenZiti SDK): use proxy" ;;
*) die "--transport '$TRANSPORT': use proxy or system" ;;
esac
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+([~+.][A-Za-z0-9.~+]+)?(-[A-Za-z0-9.~+]+)?$ ]] ||
    die "--version '$VERSION' is not a version like 0.2.0 or 0.2.0-1"
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

# ---- 1. the package ---------------------------------------------------------------------------

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
    gitlab)
        [ -n "${MONKY_DEPLOYD_GITLAB_URL:-}" ] ||
            die "--source gitlab needs MONKY_DEPLOYD_GITLAB_URL (the package's generic-registry URL, from the kit), or pass --source URL|DIR"
        echo "${MONKY_DEPLOYD_GITLAB_URL%/}/$UPSTREAM_VERSION"
        ;;
    gitea)
        [ -n "${MONKY_DEPLOYD_GITEA_URL:-}" ] ||
            die "--source gitea needs MONKY_DEPLOYD_GITEA_URL (the mirror's release-download URL), or pass --source URL|DIR"
        echo "${MONKY_DEPLOYD_GITEA_URL%/}/v$UPSTREAM_VERSION"
        ;;
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

say "installing $DEB"
run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$WORK/$DEB"

# ---- 2. docker's data root ---------------------------------------------------------------------

if [ -n "$DOCKER_DATA_ROOT" ]; then
    say "docker data root: $DOCKER_DATA_ROOT"
    if [ -e "$DOCKER_DAEMON_JSON" ]; then
        # Merging JSON in shell is how daemon.json files get broken; an existing one is the
        # operator's, so only an identical setting passes.
        if grep -q "\"data-root\"[[:space:]]*:[[:space:]]*\"$DOCKER_DATA_ROOT\"" "$DOCKER_DAEMON_JSON"; then
            echo "    $DOCKER_DAEMON_JSON already sets it"
        else
            die "$DOCKER_DAEMON_JSON exists without \"data-root\": \"$DOCKER_DATA_ROOT\"; add it by hand, restart docker, and run install.sh without --docker-data-root"
        fi
    else
        run install -d -m 0711 "$DOCKER_DATA_ROOT"
        run install -d -m 0755 "$(dirname "$DOCKER_DAEMON_JSON")"
        printf '{\n  "data-root": "%s"\n}\n' "$DOCKER_DATA_ROOT" | put "$DOCKER_DAEMON_JSON" 0644 root:root
        run systemctl restart docker.service
    fi
fi

# ---- 3. the mesh identity ----------------------------------------------------------------------

if [ -n "$ENROL_JWT" ]; then
    if [ -e "$IDENTITY" ]; then
        say "identity $IDENTITY exists; not enrolling again"
    else
        say "enrolling monky-host.$ENV_ID"
        $DRY_RUN || command -v ziti-edge-tunnel >/dev/null ||
            die "--enrol-jwt needs ziti-edge-tunnel (OpenZiti's tunneler package): install it, then re-run"
        run install -d -m 0755 "$IDENTITY_DIR"
        run ziti-edge-tunnel enroll --jwt "$ENROL_JWT" --identity "$IDENTITY"
        run systemctl try-restart ziti-edge-tunnel.service
    fi
    # An enrolment JWT is single-use and worthless once used, but it is still a credential.
    run rm -f "$ENROL_JWT"
fi
if [ -e "$IDENTITY" ] || { $DRY_RUN && [ -n "$ENROL_JWT" ]; }; then
    say "letting monky-deployd read $IDENTITY"
    run setfacl -m u:monky-deployd:x "$IDENTITY_DIR"
    run setfacl -m u:monky-deployd:r "$IDENTITY"
elif [ "$TRANSPORT" = proxy ]; then
    echo "    warning: $IDENTITY is missing; the proxy cannot start until the box is enrolled (--enrol-jwt)" >&2
fi

# ---- 4. configuration --------------------------------------------------------------------------

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

# ---- 5. the bootstrap grant --------------------------------------------------------------------

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

# ---- 6. systemd and the first tick -------------------------------------------------------------

say "enabling the timer"
run systemctl daemon-reload
if [ "$TRANSPORT" = proxy ]; then
    if $DRY_RUN || command -v ziti >/dev/null; then
        run systemctl enable --now monky-deployd-proxy.service
    else
        echo "    warning: no ziti CLI on PATH: monky-deployd-proxy.service stays off until OpenZiti's ziti package is installed" >&2
        run systemctl enable monky-deployd-proxy.service
    fi
fi
run systemctl enable --now monky-deployd.timer

say "running one tick"
if run systemctl start monky-deployd.service; then
    tick_ok=true
else
    tick_ok=false
fi
run monky-deployd --config "$CONFIG_DIR/config.yaml" status || true
if ! $tick_ok; then
    echo "install.sh: the first tick failed; see: journalctl -u monky-deployd -n 50" >&2
    exit 1
fi
say "done: monky-deployd $DEB_VERSION ticks every minute (journalctl -u monky-deployd -f)"
