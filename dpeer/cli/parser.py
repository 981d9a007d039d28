"""The `dpeer` command tree: every command's flags, help and example (docs/architecture.md "Interfaces")."""

from __future__ import annotations

import argparse
import difflib
import math
from pathlib import Path
from typing import Any, Sequence

from dpeer import __version__
from dpeer.chaos.options import add_arguments as chaos_arguments

DEFAULT_ADDR = "127.0.0.1:7100"  # the config's default listen
CLIENT_ENV = {"tls_ca": "DPEER_CACERT", "tls_cert": "DPEER_CLIENT_CERT", "tls_key": "DPEER_CLIENT_KEY",
              "token_file": "DPEER_TOKEN_FILE"}

EXAMPLES = {
    "dpeer": "dpeer start --node-id n1 --listen 127.0.0.1:7101 --data-dir d1\n"
    "  dpeer status --addr 127.0.0.1:7101 --json",
    "start": "dpeer start --node-id n1 --listen 127.0.0.1:7101 --data-dir /var/lib/dpeer\n"
    "  dpeer start --node-id n2 --listen 127.0.0.1:7102 --data-dir d2 --join 127.0.0.1:7101 --job demo\n"
    "  dpeer start --node-id n1 --data-dir d1 --job myjob:build --job-opt dim=256 --job-opt amp=true\n"
    "  dpeer start --node-id n1 --data-dir d1 --job /opt/dpeer/jobs/train.py",
    "status": "dpeer status --addr 127.0.0.1:7101 --json\n  dpeer status --addr 10.0.0.1:7100,10.0.0.2:7100",
    "members": "dpeer members --addr 127.0.0.1:7101",
    "kv": "dpeer kv put team ml-infra --addr 127.0.0.1:7101\n  dpeer kv get team --addr 127.0.0.1:7101 --json\n"
    "  DPEER_ADDR=127.0.0.1:7101 dpeer kv list --json",
    "leave": "dpeer leave --addr 127.0.0.1:7102\n  dpeer leave --node n3 --addr 127.0.0.1:7101   # n3 is dead for good",
    "force": "dpeer force --addr 127.0.0.1:7101 --voters n1,n2 --yes",
    "log": "dpeer log --addr 127.0.0.1:7101 --from 1 --to 200 --json\n"
    "  diff <(dpeer log --addr 127.0.0.1:7101 --to 200 --json) <(dpeer log --addr 127.0.0.1:7102 --to 200 --json)",
    "demo": "dpeer demo --nodes 3 --steps 500 --chaos\n  dpeer demo --steps 200 --json | tail -n 1\n"
    "  dpeer demo --job train.py --nodes 2 --steps 100\n  dpeer demo --job myjob:build --steps 100 --chaos",
    "chaos": "dpeer chaos --nodes 5 --duration 600 --fault-every 14 --steps 8000 --seed 7 --out chaos-out",
    "config": "dpeer config check dpeer.yaml\n  dpeer config show --config dpeer.yaml --preset edge",
    "kv put": "dpeer kv put team ml-infra --addr 127.0.0.1:7101\n"
    "  dpeer kv put model-card --file card.md --addr 127.0.0.1:7101\n"
    "  printf %s \"$TEXT\" | dpeer kv put note - --addr 127.0.0.1:7101\n"
    "  dpeer kv put --addr 127.0.0.1:7101 -- -flags -v",
    "kv get": "dpeer kv get team --addr 127.0.0.1:7101 --json",
    "kv list": "dpeer kv list --prefix team --addr 127.0.0.1:7101 --json",
    "kv delete": "dpeer kv delete team --addr 127.0.0.1:7101",
    "version": "dpeer version --json",
    "config show": "dpeer config show --config dpeer.yaml --preset edge",
    "job": "dpeer job retry --addr 127.0.0.1:7101",
    "job retry": "dpeer job retry --addr 127.0.0.1:7101",
    "job pause": "dpeer job pause --addr 127.0.0.1:7101",
    "job resume": "dpeer job resume --addr 127.0.0.1:7101",
    "config check": "dpeer config check /etc/dpeer/dpeer.yaml",
    "certs": "dpeer certs create-ca --dir pki\n  dpeer certs create-node n1 --host 10.0.0.1 --dir pki\n"
    "  dpeer certs create-client alice --operator --dir pki",
    "certs create-ca": "dpeer certs create-ca --dir /etc/dpeer/certs",
    "certs create-node": "dpeer certs create-node n1 --host 10.0.0.1 --host box1.lan --dir /etc/dpeer/certs",
    "certs create-client": "dpeer certs create-client alice --operator --dir pki",
    "export": "dpeer export /var/lib/dpeer --out model.safetensors\n"
    "  dpeer export d1/checkpoints/ckpt-000000000400.bin --out model.pt --json\n"
    "  dpeer export d1 --out resume-dcp --format dcp",
}


class UsageError(Exception):
    """Bad flags or config: exit 2."""


DASH_HINT = "a KEY or VALUE starting with '-' goes after '--', the options before it (dpeer kv put --addr A -- -KEY V)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one sentence and exit code 2; hint: what a missing
    or unknown argument most likely means for this command (a kv key starting with '-')."""

    def __init__(self, *args: Any, hint: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a choice (a command, a --preset), with the closest choice suggested."""
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value), names, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        if isinstance(action, argparse._SubParsersAction):
            raise UsageError(f"{value!r} is not a `{self.prog}` command{guess} (commands: {', '.join(names)}; "
                             f"see '{self.prog} --help')")
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{guess} (choose from {', '.join(names)})")

    def error(self, message: str) -> None:  # type: ignore[override]
        about_arguments = message.startswith(("the following arguments are required", "unrecognized arguments"))
        hint = f"; {self.hint}" if self.hint and about_arguments else ""
        raise UsageError(f"{message}{hint} (see '{self.prog} --help')")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, but arguments left over under `kv` (reported by this, the top parser) get the hint."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = f"; {DASH_HINT}" if getattr(parsed, "command", None) == "kv" else ""
            raise UsageError(f"unrecognized arguments: {' '.join(extras)}{hint} (see '{self.prog} --help')")
        return parsed


def _sub(subs: argparse._SubParsersAction, name: str, help_: str, path: str | None = None,
         hint: str = "") -> argparse.ArgumentParser:
    """A subcommand whose --help ends with an example (EXAMPLES[path or name])."""
    return subs.add_parser(  # type: ignore[no-any-return]
        name, help=help_, description=help_, epilog=f"example:\n  {EXAMPLES[path or name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter, hint=hint,
    )


def _seconds(text: str) -> float:
    """A --timeout: a finite number of seconds above 0 (argparse reports anything else as usage)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def _client_flags(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
    p.add_argument("--addr", help=f"HOST:PORT of any node, or a comma-separated list tried in order until one "
                   f"answers (default: $DPEER_ADDR, else the --config's advertised address, else {DEFAULT_ADDR})")
    p.add_argument("--config", type=Path, help="YAML config holding the TLS files and cluster token")
    p.add_argument("--timeout", type=_seconds, default=10.0, help="seconds to wait for the node (default 10)")
    p.add_argument("--tls-ca", type=Path, help="the cluster's CA certificate (PEM; default $DPEER_CACERT); "
                   "overrides --config's")
    p.add_argument("--tls-cert", type=Path, help="your client certificate (`dpeer certs create-client`; "
                   "default $DPEER_CLIENT_CERT)")
    p.add_argument("--tls-key", type=Path, help="your client certificate's key (default $DPEER_CLIENT_KEY)")
    p.add_argument("--token-file", type=Path, help="file holding the cluster token (default $DPEER_TOKEN_FILE)")
    p.add_argument("--json", action="store_true", help=f"{json_help}; errors too, as {{error, exit_code}} on stderr")


def _certs_parser(subs: argparse._SubParsersAction) -> None:
    certs = _sub(subs, "certs", "make the cluster's CA, token, node and client certificates (keys 0600, never overwritten)")
    cs = certs.add_subparsers(dest="certs_command", required=True, parser_class=_Parser)
    ca = _sub(cs, "create-ca", "a new CA (ca.pem, ca.key) and cluster token (cluster.token)", "certs create-ca")
    node = _sub(cs, "create-node", "node-NODE_ID.pem/.key: a node certificate naming dpeer://node/NODE_ID",
                "certs create-node")
    node.add_argument("node_id", help="the node's --node-id")
    node.add_argument("--host", action="append", default=[], help="a DNS name or IP the node is reached at (repeat)")
    client = _sub(cs, "create-client", "a client certificate: read-only, or --operator to change the cluster",
                  "certs create-client")
    client.add_argument("name", help="who holds it, e.g. alice or backup-job")
    client.add_argument("--operator", action="store_true", help="may kv put, leave, force and read the log")
    for p in (ca, node, client):
        p.add_argument("--dir", type=Path, default=Path("."), help="where the files go (default: here)")
        p.add_argument("--days", type=int, default=None, help="validity in days")
        p.add_argument("--json", action="store_true", help="print the files written as JSON")
    for p in (node, client):
        p.add_argument("--ca-dir", type=Path, default=None, help="where ca.pem and ca.key are (default: --dir)")


def _export_parser(subs: argparse._SubParsersAction) -> None:
    export = _sub(subs, "export", "write the model of a dpeer checkpoint (a data dir's newest that verifies) as "
                  "safetensors or a torch.save state dict, or model and optimizer as a torch.distributed.checkpoint "
                  "folder (docs/checkpoints.md)")
    export.add_argument("source", metavar="SOURCE", type=Path, help="a data dir, or one of its checkpoints/ckpt-*.bin")
    export.add_argument("--out", required=True, type=Path, metavar="FILE", help="the file (or DCP folder) to write")
    export.add_argument("--format", choices=["safetensors", "pt", "dcp"],
                        help="default: from --out's suffix (.safetensors; .pt or .pth for torch.save)")
    export.add_argument("--force", action="store_true", help="replace --out when it exists")
    export.add_argument("--json", action="store_true", help="print {out, format, step, checkpoint, tensors, bytes, "
                        "sha256, ...} as JSON")


def build_parser() -> argparse.ArgumentParser:
    """The full command tree."""
    parser = _Parser(prog="dpeer", description="Coordinator-free fault-tolerant PyTorch training.",
                     epilog=f"example:\n  {EXAMPLES['dpeer']}\n\n"
                     "exit codes: 0 success, 1 a negative answer (absent key, not committed, refused),\n"
                     "  2 bad usage or config, 3 node unreachable, 4 a runtime failure (port in use, data dir not writable)\n\n"
                     f"environment: DPEER_ADDR (HOST:PORT[,HOST:PORT...], default {DEFAULT_ADDR}), DPEER_CACERT, DPEER_CLIENT_CERT,\n"
                     "  DPEER_CLIENT_KEY, DPEER_TOKEN_FILE for the client commands; DPEER_<KEY> config keys",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dpeer {__version__}")
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = _sub(subs, "start", "run a node in the foreground")
    start.add_argument("--node-id", help="unique, stable name of this box")
    start.add_argument("--listen", help="HOST:PORT the gRPC server binds")
    start.add_argument("--data-dir", type=Path, help="folder for the store and checkpoints")
    start.add_argument("--join", help="HOST:PORT[,HOST:PORT...] of live members")
    start.add_argument("--advertise", help="HOST:PORT peers dial when it differs from --listen")
    start.add_argument("--config", type=Path, help="YAML config file")
    start.add_argument("--preset", choices=["lan", "wan", "edge"], help="timing preset")
    start.add_argument("--site", help="this box's site (site; default: measured from round trips)")
    start.add_argument("--job", help="demo, MODULE:FUNCTION (a build function returning a TrainSpec) or PATH.py "
                       "(your training script, run as __main__ by every box's worker)")
    start.add_argument("--job-opt", action="append", metavar="KEY=VALUE", help="an option for the job (ctx.option), "
                       "over training.options in the config; repeat for more")
    start.add_argument("--metrics-listen", help="HOST:PORT for Prometheus metrics")
    start.add_argument("--insecure", action="store_true", default=None,
                       help="run off loopback without mutual TLS and token (anyone who reaches the port controls "
                       "the node); warned at every start and shown in status")
    start.add_argument("--insecure-data-plane", action="store_true", default=None,
                       help="let the job's collectives and heal run off loopback unencrypted (each connection still "
                       "proves the generation's key); warned at every start and shown in status")
    start.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="the least severe log record written (log_level; default info)")
    start.add_argument("--log-format", choices=["json", "text"], help="JSON lines or text lines (log_format; default json)")
    for name, help_ in (("status", "print a node's status"), ("members", "list the members a node sees")):
        p = _sub(subs, name, help_)
        _client_flags(p)
    kv = _sub(subs, "kv", "read and write cluster settings")
    kvs = kv.add_subparsers(dest="kv_command", required=True, parser_class=_Parser)
    put = _sub(kvs, "put", "commit KEY VALUE, KEY - (the value from stdin) or KEY --file PATH; exit 0 only "
               "once committed. A KEY or VALUE starting with '-' goes after '--', the options before it", "kv put",
               DASH_HINT)
    put.add_argument("key", metavar="KEY", help="1-256 characters")
    put.add_argument("value", metavar="VALUE", nargs="?", help="at most 65536 characters; - reads all of stdin "
                     "(exactly: a trailing newline is kept)")
    put.add_argument("--file", type=Path, metavar="PATH", help="commit this file's content (UTF-8, exactly) as the value")
    _client_flags(put)
    get = _sub(kvs, "get", "linearizable read; exit 1 when absent; prints the value as it is", "kv get", DASH_HINT)
    get.add_argument("key", metavar="KEY", help="the key to read")
    _client_flags(get)
    ls = _sub(kvs, "list", "linearizable read of every key (under --prefix), sorted: KEY<tab>VALUE a line, "
              "backslashes and control characters escaped (\\\\, \\t, \\n, \\x1b); --json is exact", "kv list")
    ls.add_argument("--prefix", default="", help="only keys starting with this")
    _client_flags(ls)
    delete = _sub(kvs, "delete", "commit the removal of KEY; exit 1 when it was not set", "kv delete", DASH_HINT)
    delete.add_argument("key", metavar="KEY", help="the key to remove")
    _client_flags(delete)
    leave = _sub(subs, "leave", "make a node leave gracefully (its daemon exits), or remove a dead one for good (--node)")
    _client_flags(leave)
    leave.add_argument("--node", metavar="NODE_ID", help="remove this dead member (commit its leave and its removal "
                       "from the voters through the leader) instead of the addressed node")
    force = _sub(subs, "force", "UNSAFE: after losing a majority of voters for good, make the survivors the voters")
    _client_flags(force)
    force.add_argument("--voters", required=True, help="comma-separated surviving voters, the addressed node among them")
    force.add_argument("--yes", action="store_true", help="confirm: entries only the lost majority held may be lost")
    job = _sub(subs, "job", "control the cluster's job")
    jobs = job.add_subparsers(dest="job_command", required=True, parser_class=_Parser)
    retry = _sub(jobs, "retry", "train again after the leader halted the job as broken (fix the cause first)",
                 "job retry")
    _client_flags(retry)
    pause = _sub(jobs, "pause", "stop training at the next step: every worker waits, holding its state (exit 0 once "
                 "committed)", "job pause")
    _client_flags(pause)
    resume = _sub(jobs, "resume", "train on from the step a pause stopped at", "job resume")
    _client_flags(resume)
    log = _sub(subs, "log", "print a node's committed entries: index, term, kind and the sha256 of each entry's "
               "canonical bytes, to compare two nodes' committed prefixes")
    _client_flags(log, "one JSON object per line: {index, term, kind, hash}")
    log.add_argument("--from", dest="first", type=int, default=None, metavar="I",
                     help="first index (default: the first the node still holds)")
    log.add_argument("--to", dest="last", type=int, default=None, metavar="J", help="last index (default: its commit index)")
    demo = _sub(subs, "demo", "a local cluster on loopback training the demo job (or --job), shown live")
    demo.add_argument("--nodes", type=int, default=3, help="nodes to start (default 3)")
    demo.add_argument("--steps", type=int, default=None, help="steps to train, the run's training.steps (default: "
                      "the config's)")
    demo.add_argument("--job", default="demo", help="the job to train: demo (default), MODULE:FUNCTION (found "
                      "from the working directory or PYTHONPATH) or PATH.py (your training script)")
    demo.add_argument("--chaos", action="store_true", help="kill and restart nodes on a schedule")
    demo.add_argument("--seed", type=int, default=1, help="seed of the chaos schedule")
    demo.add_argument("--base-port", type=int, default=None, help="first gRPC port (default: a free block)")
    demo.add_argument("--dir", type=Path, default=None, help="data dirs go here (default: a temp dir)")
    demo.add_argument("--json", action="store_true", help="one JSON object a line (start, events, progress), the "
                      "last one the end of the run with its exit_code, final step and digest")
    chaos = _sub(subs, "chaos", "a seeded chaos run of a local cluster training the demo job, then checks")
    chaos_arguments(chaos)
    conf = _sub(subs, "config", "show the effective config or check a file")
    confs = conf.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    show = _sub(confs, "show", "print the effective config as YAML (defaults < file < DPEER_* env < flags)",
                "config show")
    show.add_argument("--config", type=Path, help="YAML config file")
    show.add_argument("--preset", choices=["lan", "wan", "edge"])
    show.add_argument("--node-id")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    check = _sub(confs, "check", "validate a config file; exit 2 when it is wrong", "config check")
    check.add_argument("file", type=Path, help="the YAML config file")
    check.add_argument("--json", action="store_true", help="print {file, ok, error} as JSON")
    _export_parser(subs)
    version = _sub(subs, "version", "print dpeer's version")
    version.add_argument("--json", action="store_true", help="print JSON")
    _certs_parser(subs)
    return parser
