#!/usr/bin/env bash
# Install dpeer as a systemd service on this box: a dpeer user, the package, a config and the unit.
# Usage: sudo scripts/install.sh NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]
set -euo pipefail
if [ "$#" -lt 2 ]; then
  echo "usage: $0 NODE_ID LISTEN_HOST:PORT [JOIN_HOST:PORT,...]" >&2
  exit 2
fi
node_id=$1 listen=$2 join=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
id -u dpeer >/dev/null 2>&1 || useradd --system --home-dir /var/lib/dpeer --shell /usr/sbin/nologin dpeer
# A venv of its own: Debian 12 and Ubuntu 23.04+ refuse pip installs into the system Python (PEP 668).
python3 -m venv /opt/dpeer/venv
/opt/dpeer/venv/bin/python -m pip install --quiet "$here"
ln -sf /opt/dpeer/venv/bin/dpeer /usr/local/bin/dpeer
install -d -m 0700 -o dpeer -g dpeer /var/lib/dpeer
install -d -m 0755 /etc/dpeer
if [ ! -e /etc/dpeer/dpeer.yaml ]; then
  {
    echo "node_id: $node_id"
    echo "listen: $listen"
    echo "data_dir: /var/lib/dpeer"
    [ -n "$join" ] && echo "join: \"$join\""
    echo "preset: lan"
  } > /etc/dpeer/dpeer.yaml
  echo "wrote /etc/dpeer/dpeer.yaml"
else
  echo "kept the existing /etc/dpeer/dpeer.yaml"
fi
bin=/opt/dpeer/venv/bin/dpeer
"$bin" config check /etc/dpeer/dpeer.yaml
sed "s#/usr/local/bin/dpeer#${bin}#" "$here/scripts/dpeer.service" > /etc/systemd/system/dpeer.service
systemctl daemon-reload
systemctl enable --now dpeer.service
echo "dpeer is running: systemctl status dpeer; dpeer status --addr $listen"
