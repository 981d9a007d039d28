#!/usr/bin/env bash
# Install dpeer as a systemd service on this box: a dpeer user, the package, a config and the unit.
# Usage: sudo scripts/install.sh [--job demo|MODULE:FUNCTION] NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]
# --job: the job every box runs (docs/jobs.md); put a MODULE of your own in /opt/dpeer/jobs first.
set -euo pipefail
usage="usage: $0 [--job demo|MODULE:FUNCTION] NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]"
job=
if [ "${1:-}" = "--job" ]; then
  [ "$#" -ge 2 ] || { echo "$usage" >&2; exit 2; }
  job=$2
  shift 2
fi
if [ "$#" -lt 2 ]; then
  echo "$usage" >&2
  exit 2
fi
node_id=$1 listen=$2 join=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "install.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run it as root (sudo $0 ...): it creates a user, /opt/dpeer, /etc/dpeer and a unit."
command -v systemctl >/dev/null || fail "systemctl is missing: dpeer installs as a systemd service."
command -v useradd >/dev/null || fail "useradd is missing (Debian/Ubuntu: apt install passwd)."
id -u dpeer >/dev/null 2>&1 || useradd --system --home-dir /var/lib/dpeer --shell /usr/sbin/nologin dpeer
# A venv of its own (Debian 12 and Ubuntu 23.04+ refuse pip installs into the system Python, PEP 668),
# made by scripts/setup: it checks for Python 3.11+ and python3-venv and picks the CPU or CUDA torch
# build (DPEER_TORCH_BUILD=cpu|cuda to choose). A copy of dpeer, not an editable install: the unit's
# ProtectHome=yes hides a checkout under /home from the service.
upgrade=0
[ -x /opt/dpeer/venv/bin/dpeer ] && upgrade=1
install -d -m 0755 /opt/dpeer
DPEER_VENV=/opt/dpeer/venv DPEER_EDITABLE=0 "$here/scripts/setup" >/dev/null
ln -sf /opt/dpeer/venv/bin/dpeer /usr/local/bin/dpeer
install -d -m 0700 -o dpeer -g dpeer /var/lib/dpeer
install -d -m 0755 /etc/dpeer
# jobs of your own live here (readable by the service; /home is hidden from it), docs where the unit says
install -d -m 0755 /opt/dpeer/jobs /usr/share/doc/dpeer
install -m 0644 "$here/README.md" "$here"/docs/*.md /usr/share/doc/dpeer/
if [ ! -e /etc/dpeer/dpeer.env ]; then
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
fi
# --- security: mutual TLS and the cluster token (README "Security") --------------------------------
# The first box (no JOIN) makes the cluster's CA, token and an operator certificate for root; every
# box gets a node certificate naming its NODE_ID, made where the CA key is. Nothing is overwritten.
certs=/etc/dpeer/certs
install -d -m 0750 -o root -g dpeer "$certs"
host=${listen%:*}; host=${host#[}; host=${host%]}
if [ ! -e "$certs/node-$node_id.pem" ]; then
  if [ -z "$join" ] && [ ! -e "$certs/ca.pem" ]; then
    /opt/dpeer/venv/bin/dpeer certs create-ca --dir "$certs"
    /opt/dpeer/venv/bin/dpeer certs create-client root --operator --dir "$certs"
  fi
  if [ ! -e "$certs/ca.key" ]; then
    echo "$0: $certs/node-$node_id.pem is missing: on the box holding the CA run" \
         "'dpeer certs create-node $node_id --host $host --dir /etc/dpeer/certs', then copy ca.pem," \
         "cluster.token, node-$node_id.pem and node-$node_id.key from there into $certs here and run this again" >&2
    exit 2
  fi
  /opt/dpeer/venv/bin/dpeer certs create-node "$node_id" --host "$host" --dir "$certs"
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
# --- end of security ---------------------------------------------------------------------------------
if [ ! -e /etc/dpeer/dpeer.yaml ]; then
  {
    echo "node_id: $node_id"
    echo "listen: $listen"
    echo "data_dir: /var/lib/dpeer"
    [ -n "$join" ] && echo "join: \"$join\""
    echo "preset: lan"
    [ -n "$job" ] && echo "job: \"$job\""
    echo "security:"
    echo "  tls_ca: $certs/ca.pem"
    echo "  tls_cert: $certs/node-$node_id.pem"
    echo "  tls_key: $certs/node-$node_id.key"
    echo "  cluster_token_file: $certs/cluster.token"
  } > /etc/dpeer/dpeer.yaml
  echo "wrote /etc/dpeer/dpeer.yaml"
else
  echo "kept the existing /etc/dpeer/dpeer.yaml"
  if [ -n "$job" ]; then echo "install.sh: --job $job was not written: set job: in /etc/dpeer/dpeer.yaml" >&2; fi
fi
bin=/opt/dpeer/venv/bin/dpeer
# checked in the service's environment (its PYTHONPATH finds the job), from / as the service runs
( set -a; . /etc/dpeer/dpeer.env; set +a; cd /; "$bin" config check /etc/dpeer/dpeer.yaml )
sed "s#/usr/local/bin/dpeer#${bin}#" "$here/scripts/dpeer.service" > /etc/systemd/system/dpeer.service
systemctl daemon-reload
if [ "$upgrade" = 1 ] && systemctl is-active --quiet dpeer.service; then
  # an upgrade: the running daemon still has the old code; SIGTERM leaves gracefully, then it starts again
  systemctl restart dpeer.service
  echo "upgraded dpeer and restarted the service"
else
  systemctl enable --now dpeer.service
fi
echo "dpeer is running: systemctl status dpeer; dpeer status --addr $listen --config /etc/dpeer/client.yaml (an operator's credentials: on the first box)"
