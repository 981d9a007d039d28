"""The `dpeer` command line: the public contract of docs/architecture.md "Interfaces".

Exit codes: 0 success, 1 a negative answer (absent key, not committed), 2 bad usage or config
(the unit does not restart on it), 3 node unreachable (or something else answering there), 4 a
runtime failure (a port in use, a data dir it cannot write: the unit restarts). Errors go to
stderr as one clear sentence, under --json as one JSON object {error, exit_code}. Client commands
find the node at --addr, else DPEER_ADDR (each a comma-separated list, tried in order), else the
--config's advertised address, else 127.0.0.1:7100 (cli/dial.py), and their credentials in
--tls-*/--token-file, else DPEER_CACERT, DPEER_CLIENT_CERT, DPEER_CLIENT_KEY and DPEER_TOKEN_FILE,
else --config's security block.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from dpeer.daemon import config as cfg
from dpeer import __version__, errors
from dpeer.chaos.options import options_from as chaos_options
from dpeer.cli.export import cmd_export
from dpeer.cli.dial import NoNodeAnswered, check_pair, one_node, readable, run
from dpeer.cli.output import report, wants_json
from dpeer.cli.parser import UsageError, build_parser
from dpeer.cli.status_text import member_rows, members_table, status_lines

if TYPE_CHECKING:  # grpc loads only where a command talks to a node: `start` spawns its worker first
    from dpeer.transport.client import NodeClient

EXIT_OK, EXIT_NO, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_RUNTIME = 0, 1, 2, 3, 4


class RuntimeFailure(Exception):
    """The config was good but running failed (a port in use, a data dir it cannot write): exit 4, restartable."""


class Negative(Exception):
    """The node answered no (not committed, not set, refused): exit 1 with this sentence."""


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """Print doc as one JSON line under --json, else the text."""
    print(json.dumps(doc, sort_keys=True) if args.json else text)


def cmd_status(args: argparse.Namespace) -> int:
    """Print one JSON object (--json) or the node, its job and its members as text."""
    doc = json.loads(run(args, lambda c: c.status()).json)
    _emit(args, doc, "\n".join(status_lines(doc)))
    return EXIT_OK


def cmd_members(args: argparse.Namespace) -> int:
    """Print the members this node sees: address, state, role (leader, voter, learner or - while
    not committed), rank and step in its group."""
    doc = json.loads(run(args, lambda c: c.status()).json)
    rows = member_rows(doc)
    _emit(args, rows, "\n".join(members_table(rows)))
    return EXIT_OK


def _check_kv(args: argparse.Namespace) -> None:
    """UsageError for a key, value or prefix the node would refuse as too long, before dialling it."""
    from dpeer.statemachine.entry import MAX_KEY, MAX_VALUE
    for name, attr in (("KEY", "key"), ("VALUE", "value"), ("--prefix", "prefix")):
        _check_utf8(name, getattr(args, attr, None))
    key = getattr(args, "key", None)
    if key is not None and not 1 <= len(key) <= MAX_KEY:
        raise UsageError(f"KEY must be 1 to {MAX_KEY} characters, not {len(key)}")
    if len(getattr(args, "value", None) or "") > MAX_VALUE:
        raise UsageError(f"VALUE must be at most {MAX_VALUE} characters, not {len(args.value)}")
    if len(getattr(args, "prefix", "")) > MAX_KEY:
        raise UsageError(f"--prefix must be at most {MAX_KEY} characters, not {len(args.prefix)}")


def _check_utf8(name: str, text: str | None) -> None:
    """UsageError naming the argument when it holds bytes that are not UTF-8 (Python keeps them
    as lone surrogates, which no node would take), as stdin's and --file's values get."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff else f"character U+{code:04X}"
        raise UsageError(f"{name} is not UTF-8 text ({what} at character {exc.start + 1}); kv keys, values "
                         "and prefixes are UTF-8 text: encode other bytes as text first (base64, say)") from None


def _put_value(args: argparse.Namespace) -> str:
    """kv put's value: VALUE as given, all of stdin for `-`, or the --file's content, each exactly
    and at most MAX_VALUE characters; UsageError in one sentence otherwise."""
    from dpeer.cli.kv_text import read_value
    from dpeer.statemachine.entry import MAX_VALUE
    if args.value is not None and args.file is not None:
        raise UsageError(f"give VALUE or --file {args.file}, not both")
    if args.value is None and args.file is None:
        raise UsageError("give the value as VALUE, as - to read it from stdin, or as --file PATH; "
                         "a KEY or VALUE starting with '-' goes after '--', the options before it")
    if args.value == "-":
        return read_value(sys.stdin.buffer, "stdin", MAX_VALUE)
    if args.value is not None:
        return str(args.value)
    try:
        with open(args.file, "rb") as f:
            return read_value(f, f"--file {args.file}", MAX_VALUE)
    except OSError as exc:
        raise UsageError(f"--file {args.file} cannot be read: {exc.strerror or exc}") from None


def cmd_kv(args: argparse.Namespace) -> int:
    """kv put waits for the commit; kv get reads linearizably and exits 1 when absent."""
    _check_kv(args)
    if args.kv_command == "put":
        value = _put_value(args)
        reply = run(args, lambda c: c.kv_put(args.key, value, timeout=args.timeout), writes=True)
        if not reply.committed:
            raise Negative(f"not committed: {reply.reason}")
        _emit(args, {"key": args.key, "committed": True, "index": reply.index}, f"committed at index {reply.index}")
        return EXIT_OK
    if args.kv_command == "list":
        from dpeer.cli.kv_text import escape
        listed = run(args, lambda c: c.kv_list(args.prefix))
        pairs = {p.key: p.value for p in listed.pairs}
        _emit(args, pairs, "\n".join(f"{escape(k)}\t{escape(v)}" for k, v in pairs.items()))
        return EXIT_OK
    if args.kv_command == "delete":
        return _kv_delete(args)
    reply = run(args, lambda c: c.kv_get(args.key))
    if args.json:
        print(json.dumps({"key": args.key, "found": reply.found, "value": reply.value if reply.found else None}))
    elif reply.found:
        print(reply.value)
    if not reply.found:
        raise Negative(f"key {args.key!r} is not set")
    return EXIT_OK


def _kv_delete(args: argparse.Namespace) -> int:
    """kv delete: exit 1 when the key was not set."""
    deleted = run(args, lambda c: c.kv_delete(args.key, timeout=args.timeout), writes=True)
    if args.json or deleted.found:
        _emit(args, {"key": args.key, "found": deleted.found, "index": deleted.index},
              f"deleted at index {deleted.index}")
    if not deleted.found:
        raise Negative(f"key {args.key!r} is not set")
    return EXIT_OK


def cmd_force(args: argparse.Namespace) -> int:
    """Forced reconfiguration; refuses without --yes."""
    if not args.yes:
        raise UsageError("force can lose entries that only the lost voters held; add --yes to confirm")
    one_node(args, "force")
    voters = [v.strip() for v in args.voters.split(",") if v.strip()]
    reply = run(args, lambda c: c.force(voters), writes=True)
    _emit(args, {"voters": voters, "term": reply.term, "epoch": reply.epoch, "reason": reply.reason},
          f"forced: voters are now {', '.join(voters)} (term {reply.term}); {reply.reason}")
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    """Print committed entries [--from, --to]; exit 1 when part of the range is compacted away
    or not committed on that node (what it holds of the range is printed first)."""
    if (args.first is not None and args.first < 1) or (args.last is not None and args.last < 1):
        raise UsageError("--from and --to are log indexes, 1 or more")
    if args.first is not None and args.last is not None and args.first > args.last:
        raise UsageError(f"--from {args.first} is after --to {args.last}")
    from dpeer.statemachine.entry import entry_digest

    async def fetch(client: NodeClient) -> tuple[dict[str, Any], list[Any]]:
        doc = json.loads((await client.status()).json)
        lo = doc["first_index"] if args.first is None else max(args.first, doc["first_index"])
        hi = doc["commit_index"] if args.last is None else min(args.last, doc["commit_index"])
        chunks = [c async for c in client.fetch_entries(lo, hi, "")] if lo <= hi else []
        return doc, [e for c in chunks for e in c.entries]

    doc, entries = run(args, fetch)
    for e in entries:
        row = {"index": e.index, "term": e.term, "kind": e.kind.value, "hash": entry_digest(e)}
        print(json.dumps(row, sort_keys=True) if args.json else f"{e.index:>10} {e.term:>6} {e.kind.value:<14} {row['hash']}")
    if args.first is not None and args.first < doc["first_index"]:
        raise Negative(f"entries below {doc['first_index']} are compacted on {doc['node_id']} (snapshot at "
                       f"{doc['snapshot_index']}); start at --from {doc['first_index']}")
    if args.last is not None and args.last > doc["commit_index"]:
        raise Negative(f"entries after {doc['commit_index']} are not committed on {doc['node_id']}")
    return EXIT_OK


def cmd_leave(args: argparse.Namespace) -> int:
    """Ask the node to leave, or (--node) remove a member gossip holds dead; exit 1 if refused."""
    if args.node:
        return _remove_dead(args)
    one_node(args, "leave")
    reply = run(args, lambda c: c.leave(), writes=True)
    if not reply.accepted:
        raise Negative(f"the node did not leave: {reply.reason}")
    _emit(args, {"left": True}, "left")
    return EXIT_OK


def _remove_dead(args: argparse.Namespace) -> int:
    """Commit a dead member's leave through the addressed node, refusing a live or unknown one."""
    async def remove(client: NodeClient) -> str | None:
        doc = json.loads((await client.status()).json)
        seen = {m["node_id"]: m for m in doc["members"]}
        member = seen.get(args.node)
        if args.node == doc["node_id"]:
            return f"{args.node} is the addressed node: run `dpeer leave --addr` without --node to make it leave"
        if member is None or member.get("committed") is None:
            return f"{args.node} is not a member that {doc['node_id']} knows"
        if member["state"] == "alive":
            return (f"{args.node} is alive: make it leave gracefully with `dpeer leave --addr {member['addr']}`, "
                    "or stop it first")
        await client.leave(args.node, forwarded=True)
        return None

    refused = run(args, remove, writes=True)
    if refused is not None:
        raise Negative(f"not removed: {refused}")
    _emit(args, {"removed": args.node}, f"removed {args.node}: its leave is committed and it no longer votes")
    return EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    """`job retry|pause|resume`: commit the job as running again, or pause or resume training;
    exit 1 when refused (not failed, already paused, already running)."""
    action = args.job_command
    reply = run(args, lambda c: c.job_control(action), writes=True)
    done = {"retry": "retried", "pause": "paused", "resume": "resumed"}[action]
    if not reply.accepted:
        raise Negative(f"not {done}: {reply.reason}")
    _emit(args, {done: True, "reason": reply.reason, "index": reply.index},
          f"{reply.reason} (committed at index {reply.index})")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """Show the effective config or check a file."""
    import yaml

    if args.config_command == "check":
        try:
            _check_config_file(args.file)
        except cfg.ConfigError as exc:
            if args.json:
                print(json.dumps({"file": str(args.file), "ok": False, "error": str(exc)}))
            raise
        _emit(args, {"file": str(args.file), "ok": True, "error": None}, f"{args.file}: ok")
        return EXIT_OK
    effective = cfg.load(args.config, {"preset": args.preset, "node_id": args.node_id})
    doc = json.loads(effective.model_dump_json())
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return EXIT_OK


def _check_config_file(path: Path) -> None:
    """ConfigError unless `dpeer start --config path` would get past its checks: the file's own
    (cfg.check_file), then the refusals start runs before the worker (check_security), so that
    check and start agree on every file."""
    config = cfg.check_file(path)
    try:
        check_security(config)
    except UsageError as exc:
        raise cfg.ConfigError(f"{path}: {exc}") from None


def cmd_version(args: argparse.Namespace) -> int:
    """Print the version (the package's), with Python's under --json."""
    _emit(args, {"version": __version__, "python": sys.version.split()[0]}, f"dpeer {__version__}")
    return EXIT_OK


def cmd_start(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM, SIGINT or `dpeer leave`."""
    flags = {
        "node_id": args.node_id, "listen": args.listen, "data_dir": args.data_dir, "join": args.join,
        "advertise": args.advertise, "preset": args.preset, "job": args.job, "site": args.site,
        "metrics_listen": args.metrics_listen, "security.insecure": args.insecure,
        "security.insecure_data_plane": args.insecure_data_plane, "training.options": _job_options(args.job_opt),
        "log_level": args.log_level, "log_format": args.log_format,
    }
    config = cfg.load(args.config, flags)
    if config.node_id is None:
        raise UsageError("--node-id (or node_id in the config, or DPEER_NODE_ID) is required")
    check_security(config)
    wildcard = cfg.wildcard_refusal(config)
    if wildcard is not None:
        raise UsageError(wildcard)
    try:
        if config.metrics_listen is not None:
            from dpeer.daemon.serve.metrics import check_listen
            check_listen(config.metrics_listen)  # before the data dir: a busy port founds no cluster
        from dpeer.daemon import logs
        from dpeer.daemon.data_dir import private_data_dir
        logs.setup(lambda: {"node": config.node_id}, config.log_level, config.log_format)
        private_data_dir(config.data_dir)  # before the worker, which inherits its umask
        worker = start_worker_early(config)
        from dpeer.daemon.daemon import run_daemon  # the gRPC stack loads while the worker imports torch

        return run_daemon(config, worker)
    except (OSError, ValueError) as exc:  # the config was accepted: whatever fails now is worth a restart
        raise RuntimeFailure(str(exc)) from exc


def _job_options(given: list[str] | None) -> dict[str, str] | None:
    """--job-opt KEY=VALUE flags as a mapping (each over the config's training.options key), None when none."""
    if not given:
        return None
    options = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--job-opt {item!r} is not KEY=VALUE (for example --job-opt dim=256)")
        options[key.strip()] = value
    return options


def check_security(config: cfg.NodeConfig) -> None:
    """Refuse (exit 2) to start exposed without mutual TLS and token, with a key or token others
    can read, with /metrics in clear off loopback, or with a certificate that names another node
    (when the node id is known: `config check` of a file without one); before the worker is
    spawned, so nothing is left running."""
    from dpeer.security import auth, exposure
    s = config.security
    tls = [s.tls_cert, s.tls_key, s.tls_ca]
    if any(tls) and not all(tls):
        raise UsageError("mutual TLS needs all of security.tls_cert, tls_key and tls_ca")
    mode = auth.mode_of(all(tls), s.cluster_token_file is not None)
    for reason in (exposure.refusal(cfg.parse_hostport(config.listen)[0], mode, s.insecure),
                   exposure.data_plane_refusal(config.store_bind[0], config.job is not None, s.insecure,
                                               s.insecure_data_plane),
                   cfg.open_secret_refusal(s), cfg.metrics_refusal(config)):
        if reason is not None:
            raise UsageError(reason)
    contents = {name: readable(f"security.{name}", path) for name, path in
                (("tls_cert", s.tls_cert), ("tls_key", s.tls_key), ("tls_ca", s.tls_ca),
                 ("cluster_token_file", s.cluster_token_file)) if path is not None}
    if s.tls_cert is not None:
        from dpeer.security import certs
        try:
            named = certs.identity_of(contents["tls_cert"])
        except certs.CertError as exc:
            raise UsageError(f"security.tls_cert {s.tls_cert}: {exc}") from None
        assert s.tls_key is not None  # all three TLS files or none, checked above
        check_pair(("security.tls_cert", s.tls_cert, contents["tls_cert"]),
                    ("security.tls_key", s.tls_key, contents["tls_key"]))
        if config.node_id is not None and named != auth.Principal(auth.CallerRole.NODE, config.node_id):
            raise UsageError(f"security.tls_cert {s.tls_cert} names {named}, not node/{config.node_id}; make this "
                             f"node's certificate with `dpeer certs create-node {config.node_id}`")


def cmd_certs(args: argparse.Namespace) -> int:
    """Make a CA and token, a node certificate or a client certificate."""
    from dpeer.security import certs
    days = {} if args.days is None else {"days": args.days}
    if args.days is not None and args.days < 1:
        raise UsageError("--days must be at least 1")
    try:
        if args.certs_command == "create-ca":
            made, token = certs.create_ca(args.dir, **days)
            _emit(args, {"cert": str(made.cert), "key": str(made.key), "token": str(token)},
                  f"wrote {made.cert} (the CA certificate: give it to every node and client), {made.key} "
                  f"(keep it private: it signs certificates) and {token} (the cluster token)")
            return EXIT_OK
        ca_dir = args.ca_dir or args.dir
        if args.certs_command == "create-node":
            made = certs.create_node(ca_dir, args.dir, args.node_id, args.host, **days)
        else:
            made = certs.create_client(ca_dir, args.dir, args.name, args.operator, **days)
    except certs.CertError as exc:
        raise UsageError(str(exc)) from None
    _emit(args, {"cert": str(made.cert), "key": str(made.key)}, f"wrote {made.cert} and {made.key}")
    return EXIT_OK


def start_worker_early(config: cfg.NodeConfig) -> Any:
    """Spawn the job's worker before the daemon's heavy imports (see daemon.start_worker)."""
    if not config.job:
        return None
    from dpeer.daemon.worker.supervisor import WorkerSupervisor

    worker = WorkerSupervisor(config.node_id or "", config.job, config.data_dir, config.training,
                              store_bind=config.store_bind)
    worker.start(0.0)
    return worker


def cmd_demo(args: argparse.Namespace) -> int:
    """Start a local cluster training the demo job (or --job) and show it live."""
    from dpeer.cli.demo import run_demo

    return run_demo(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    """Run a seeded chaos run and its checks; exit 1 on any violation."""
    from dpeer.chaos.command import run_chaos

    return run_chaos(chaos_options(args))


COMMANDS = {
    "start": cmd_start, "status": cmd_status, "members": cmd_members, "kv": cmd_kv,
    "leave": cmd_leave, "force": cmd_force, "log": cmd_log, "config": cmd_config, "demo": cmd_demo, "chaos": cmd_chaos,
    "job": cmd_job, "certs": cmd_certs, "version": cmd_version, "export": cmd_export,
}


def _unreachable_hint(exc: errors.Unreachable) -> str:
    """What to check when no node answered at an address (or a list of them)."""
    if isinstance(exc, NoNodeAnswered):
        return "is a daemon running at one of them?"
    if isinstance(exc, errors.WrongProtocol):
        return "point --addr at a dpeer node's gRPC address (its listen or advertise address)"
    return "is its daemon running?"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dpeer` command; returns the exit code. Errors are one sentence on
    stderr, under --json one JSON object {error, exit_code} (cli/output.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = wants_json(argv)
    try:
        args = build_parser().parse_args(argv)
        as_json = bool(getattr(args, "json", as_json))
        return COMMANDS[args.command](args)
    except (UsageError, cfg.ConfigError, ValueError) as exc:
        return report(str(exc), EXIT_USAGE, as_json)
    except (RuntimeFailure, OSError) as exc:
        return report(str(exc), EXIT_RUNTIME, as_json)
    except errors.Unreachable as exc:
        return report(f"{exc}; {_unreachable_hint(exc)}", EXIT_UNREACHABLE, as_json)
    except errors.Denied as exc:
        return report(f"refused: {exc}", EXIT_NO, as_json)
    except (errors.PeerError, Negative) as exc:
        return report(str(exc), EXIT_NO, as_json)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
