#!/usr/bin/env bash
# Install dpeer as a systemd service on this box: a dpeer user, the package, a config and the unit.
# Usage: sudo scripts/install.sh [FLAGS] NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]
# --job: the job every box runs (docs/jobs.md); put a MODULE or script of your own in /opt/dpeer/jobs first
# (a relative PATH.py is written as its absolute path: the service runs from /).
# --preset: the timing preset (lan, wan or edge); --metrics-listen: HOST:PORT for Prometheus.
# --from: a dpeer wheel or a bundle (scripts/bundle: no index needed, nor a network when it holds
# torch) instead of the checkout or bundle this script lies in; --insecure-data-plane: the job trains
# between boxes unencrypted (docs/security.md "The data plane"; off loopback dpeer refuses a job
# without it, or an encrypted network). The certificates a joining box needs are checked before
# anything is installed.
# Sourcing this file defines its steps without running them.
set -euo pipefail
usage="usage: $0 [--job demo|MODULE:FUNCTION|PATH.py] [--preset lan|wan|edge] [--metrics-listen HOST:PORT] [--from WHEEL|BUNDLE] [--insecure-data-plane] NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
certs=/etc/dpeer/certs
bin=/opt/dpeer/venv/bin/dpeer
fail() { echo "install.sh: $*" >&2; exit 1; }
bad_usage() { [ "$#" -eq 0 ] || echo "install.sh: $*" >&2; echo "$usage" >&2; exit 2; }

# Sets job, preset, metrics, from, node_id, listen and join from the command line; exit 2 on a bad one
# (the config check after the install is the authority on values; this catches typos before it).
parse_args() {
  job="" preset="" metrics="" from="" data_plane=""
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --insecure-data-plane) data_plane=insecure; shift ;;
      --job|--preset|--metrics-listen|--from)
        [ "$#" -ge 2 ] || bad_usage
        case "$1" in
          --job) job=$2; [[ $job != *.py || $job == /* ]] || job=$PWD/$job ;;
          --preset) preset=$2 ;;
          --metrics-listen) metrics=$2 ;;
          --from) from=$2 ;;
        esac
        shift 2 ;;
      -*) bad_usage "unknown option $1." ;;
      *) break ;;
    esac
  done
  [ "$#" -ge 2 ] && [ "$#" -le 3 ] || bad_usage
  node_id=$1 listen=$2 join=${3:-}
  [[ $node_id =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] \
    || bad_usage "NODE_ID '$node_id': node ids are 1-64 letters, digits, '.', '_' or '-', starting alphanumeric."
  case "$preset" in
    ""|lan|wan|edge) ;;
    *) bad_usage "--preset takes lan, wan or edge, not '$preset'." ;;
  esac
  [ -z "$from" ] || [[ ( -f $from && $(basename "$from") == dpeer-*.whl ) || ( -d $from && -n $(compgen -G "$from/dpeer-*.whl") ) ]] \
    || bad_usage "--from $from is neither a dpeer wheel (dpeer-*.whl) nor a bundle (a directory holding one: scripts/bundle makes it)."
  [ -z "$metrics" ] || [[ $metrics =~ ^(\[[0-9A-Fa-f:.]+\]|[^:\ ]+):[0-9]+$ ]] \
    || bad_usage "--metrics-listen takes HOST:PORT (for example 10.0.0.1:7190), not '$metrics'."
}

# What the box needs before anything is installed: root, systemd, useradd.
check_prerequisites() {
  [ "$(id -u)" = 0 ] || fail "run it as root (sudo $0 ...): it creates a user, /opt/dpeer, /etc/dpeer and a unit."
  command -v systemctl >/dev/null || fail "systemctl is missing: dpeer installs as a systemd service."
  command -v useradd >/dev/null || fail "useradd is missing (Debian/Ubuntu: apt install passwd)."
}

# The certificates this box will use, checked before installing anything (exit 2 when missing):
# the first box (no JOIN, no CA yet) makes them; a box holding the CA key makes its node certificate;
# any other box needs ca.pem, cluster.token and its node certificate copied in from the CA's box.
check_certs() {
  local node=$certs/node-$node_id need=() missing=() f host
  if [ -e "$node.pem" ]; then need=("$node.key" "$certs/ca.pem" "$certs/cluster.token")
  elif [ -z "$join" ] && [ ! -e "$certs/ca.pem" ]; then return 0
  elif [ -e "$certs/ca.key" ]; then need=("$certs/ca.pem" "$certs/cluster.token")
  else
    host=${listen%:*}; host=${host#[}; host=${host%]}
    echo "$0: $node.pem is missing: on the box holding the CA run" \
         "'dpeer certs create-node $node_id --host $host --dir /etc/dpeer/certs', then copy ca.pem," \
         "cluster.token, node-$node_id.pem and node-$node_id.key from there into $certs here and run this again" >&2
    exit 2
  fi
  for f in "${need[@]}"; do [ -e "$f" ] || missing+=("$f"); done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "$0: ${missing[*]} missing: copy them from the box holding the CA into $certs and run this again" >&2
  exit 2
}

# Where dpeer comes from, as an absolute path: --from (a dpeer wheel or a bundle), else the checkout
# or bundle this script lies in.
package_source() {
  [ -n "$from" ] || { echo "$here"; return 0; }
  (cd "$(dirname "$from")" && echo "$(pwd)/$(basename "$from")")
}

# The system user the service runs as.
make_user() {
  id -u dpeer >/dev/null 2>&1 || useradd --system --home-dir /var/lib/dpeer --shell /usr/sbin/nologin dpeer
}

# A venv of its own (Debian 12 and Ubuntu 23.04+ refuse pip installs into the system Python, PEP 668),
# made by scripts/setup: it checks for Python 3.11+ and python3-venv and picks the CPU or CUDA torch
# build (DPEER_TORCH_BUILD=cpu|cuda to choose), or takes everything from a bundle with no index. A
# copy of dpeer, not an editable install: the unit's ProtectHome=yes hides a checkout under /home.
install_package() {
  install -d -m 0755 /opt/dpeer
  DPEER_VENV=/opt/dpeer/venv DPEER_EDITABLE=0 DPEER_FROM="$1" "$here/scripts/setup" >/dev/null
  ln -sf /opt/dpeer/venv/bin/dpeer /usr/local/bin/dpeer
  install -d -m 0700 -o dpeer -g dpeer /var/lib/dpeer
  install -d -m 0755 /etc/dpeer
  # jobs of your own live here (readable by the service; /home is hidden from it), docs where the unit says
  install -d -m 0755 /opt/dpeer/jobs /usr/share/doc/dpeer
  install -m 0644 "$here/README.md" "$here"/docs/*.md /usr/share/doc/dpeer/
}

write_env() {
  [ ! -e /etc/dpeer/dpeer.env ] || return 0
  {
    echo "# Environment of the dpeer service (EnvironmentFile= of dpeer.service)."
    echo "# Where the job's module is found (docs/jobs.md):"
    echo "PYTHONPATH=/opt/dpeer/jobs"
    echo "# GPU boxes with several interfaces: the one NCCL connects over (Gloo binds the advertised address):"
    echo "#NCCL_SOCKET_IFNAME=eth0"
    echo "# Which GPU the worker trains on (cuda:0 is the first one listed):"
    echo "#CUDA_VISIBLE_DEVICES=0"
  } > /etc/dpeer/dpeer.env
  echo "wrote /etc/dpeer/dpeer.env"
}

# --- security: mutual TLS and the cluster token (docs/security.md) --------------------------------
# The first box (no JOIN) makes the cluster's CA, token and an operator certificate for root; every
# box gets a node certificate naming its NODE_ID, made where the CA key is. Nothing is overwritten.
make_certs() {
  install -d -m 0750 -o root -g dpeer "$certs"
  local host=${listen%:*}; host=${host#[}; host=${host%]}
  if [ ! -e "$certs/node-$node_id.pem" ]; then
    if [ -z "$join" ] && [ ! -e "$certs/ca.pem" ]; then
      "$bin" certs create-ca --dir "$certs"
      "$bin" certs create-client root --operator --dir "$certs"
    fi
    "$bin" certs create-node "$node_id" --host "$host" --dir "$certs"
  fi
  chown dpeer:dpeer "$certs/node-$node_id.key" "$certs/cluster.token"
  if [ -e "$certs/operator-root.pem" ] && [ ! -e /etc/dpeer/client.yaml ]; then
    # root's credentials for the CLI: dpeer status --config /etc/dpeer/client.yaml --addr ...
    ( umask 077; {
      echo "security:"
      echo "  tls_ca: $certs/ca.pem"
      echo "  tls_cert: $certs/operator-root.pem"
      echo "  tls_key: $certs/operator-root.key"
      echo "  cluster_token_file: $certs/cluster.token"
    } > /etc/dpeer/client.yaml )
  fi
}
# --- end of security ---------------------------------------------------------------------------------

# The node's config; an existing one is kept, and flags it would have taken are named.
write_config() {
  if [ -e /etc/dpeer/dpeer.yaml ]; then
    echo "kept the existing /etc/dpeer/dpeer.yaml"
    [ -z "$job" ] || echo "install.sh: --job $job was not written: set job: in /etc/dpeer/dpeer.yaml" >&2
    [ -z "$preset" ] || echo "install.sh: --preset $preset was not written: set preset: in /etc/dpeer/dpeer.yaml" >&2
    [ -z "$metrics" ] || echo "install.sh: --metrics-listen $metrics was not written: set metrics_listen: in /etc/dpeer/dpeer.yaml" >&2
    [ -z "$data_plane" ] || echo "install.sh: --insecure-data-plane was not written: set security.insecure_data_plane: true in /etc/dpeer/dpeer.yaml" >&2
    return 0
  fi
  {
    echo "node_id: $node_id"
    echo "listen: $listen"
    echo "data_dir: /var/lib/dpeer"
    [ -n "$join" ] && echo "join: \"$join\""
    echo "preset: ${preset:-lan}"
    [ -n "$job" ] && echo "job: \"$job\""
    [ -n "$metrics" ] && echo "metrics_listen: \"$metrics\""
    echo "security:"
    echo "  tls_ca: $certs/ca.pem"
    echo "  tls_cert: $certs/node-$node_id.pem"
    echo "  tls_key: $certs/node-$node_id.key"
    echo "  cluster_token_file: $certs/cluster.token"
    # the job's collectives and heal travel unencrypted between boxes (docs/security.md "The data plane")
    [ -n "$data_plane" ] && echo "  insecure_data_plane: true"
  } > /etc/dpeer/dpeer.yaml
  echo "wrote /etc/dpeer/dpeer.yaml"
}

# Checked in the service's environment (its PYTHONPATH finds the job), from / as the service runs.
check_config() {
  ( set -a; . /etc/dpeer/dpeer.env; set +a; cd /; "$bin" config check /etc/dpeer/dpeer.yaml )
}

# The unit, pointed at the venv's dpeer; an upgrade restarts a running daemon (SIGTERM leaves gracefully).
start_service() {
  sed "s#/usr/local/bin/dpeer#${bin}#" "$here/scripts/dpeer.service" > /etc/systemd/system/dpeer.service
  systemctl daemon-reload
  if [ "$1" = 1 ] && systemctl is-active --quiet dpeer.service; then
    systemctl restart dpeer.service
    echo "upgraded dpeer and restarted the service"
  else
    systemctl enable --now dpeer.service
  fi
}

main() {
  parse_args "$@"
  check_prerequisites
  check_certs
  local src upgrade=0
  src=$(package_source)
  [ -x /opt/dpeer/venv/bin/dpeer ] && upgrade=1
  make_user
  install_package "$src"
  write_env
  make_certs
  write_config
  check_config
  start_service "$upgrade"
  echo "dpeer is running: systemctl status dpeer; dpeer status --addr $listen --config /etc/dpeer/client.yaml (an operator's credentials: on the first box)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
