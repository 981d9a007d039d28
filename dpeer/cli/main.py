"""The `dpeer` command line: the public contract of docs/architecture.md "Interfaces".

Exit codes: 0 success, 1 a negative answer (absent key, not committed), 2 bad usage or config
(the unit does not restart on it), 3 node unreachable, 4 a runtime failure (a port in use, a data
dir it cannot write: the unit restarts). Errors go to stderr as one clear sentence. Client commands find the node
at --addr, else DPEER_ADDR, else the --config's advertised address, else 127.0.0.1:7100, and their
credentials in --tls-*/--token-file, else DPEER_CACERT, DPEER_CLIENT_CERT, DPEER_CLIENT_KEY and
DPEER_TOKEN_FILE, else --config's security block.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from dpeer.daemon import config as cfg
from dpeer import __version__, errors
from dpeer.chaos.options import options_from as chaos_options
from dpeer.cli.parser import CLIENT_ENV, DEFAULT_ADDR, UsageError, build_parser

if TYPE_CHECKING:  # grpc loads only where a command talks to a node: `start` spawns its worker first
    from dpeer.transport.client import NodeClient
    from dpeer.transport.options import Security

EXIT_OK, EXIT_NO, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_RUNTIME = 0, 1, 2, 3, 4


class RuntimeFailure(Exception):
    """The config was good but running failed (a port in use, a data dir it cannot write): exit 4, restartable."""


def _env_path(name: str) -> Path | None:
    value = os.environ.get(CLIENT_ENV[name], "").strip()
    return Path(value) if value else None


def _security(args: argparse.Namespace) -> Security:
    """The client's credentials: each file from its flag, else its environment variable, else
    --config's security block."""
    from dpeer.transport.options import Security

    s = cfg.load(args.config).security if args.config is not None else cfg.SecurityConfig()
    files = {"--tls-cert": args.tls_cert or _env_path("tls_cert") or s.tls_cert,
             "--tls-key": args.tls_key or _env_path("tls_key") or s.tls_key,
             "--tls-ca": args.tls_ca or _env_path("tls_ca") or s.tls_ca,
             "--token-file": args.token_file or _env_path("token_file") or s.cluster_token_file}
    for flag, path in files.items():
        if path is not None and not path.is_file():
            raise UsageError(f"{flag}: file {path} does not exist")
        if path is not None:
            _readable(flag, path)
    try:
        security = Security.from_files(*files.values())
    except ValueError as exc:
        raise UsageError(str(exc).replace("security.tls_cert, tls_key and tls_ca", "--tls-cert, --tls-key and --tls-ca"))
    cert, key = files["--tls-cert"], files["--tls-key"]
    if security.cert is not None and security.key is not None and cert is not None and key is not None:
        _check_pair(("--tls-cert", cert, security.cert), ("--tls-key", key, security.key))
    return security


def node_addr(args: argparse.Namespace) -> str:
    """--addr, else DPEER_ADDR, else the --config's advertised address, else the default listen."""
    addr = args.addr or os.environ.get("DPEER_ADDR", "").strip()
    source = "--addr" if args.addr else "DPEER_ADDR"
    if not addr:
        addr = cfg.load(args.config).advertise_addr if args.config is not None else DEFAULT_ADDR
        source = "--config" if args.config is not None else "the default address"
    try:
        cfg.parse_hostport(addr)
    except ValueError as exc:
        raise UsageError(f"{source}: {exc}") from None
    return addr


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """Print doc as one JSON line under --json, else the text."""
    print(json.dumps(doc, sort_keys=True) if args.json else text)


def _run(args: argparse.Namespace, call: Callable[[NodeClient], Any]) -> Any:
    import asyncio

    from dpeer.transport.client import NodeClient

    args.addr = node_addr(args)

    async def go() -> Any:
        async with NodeClient(args.addr, _security(args), timeout=args.timeout) as client:
            return await call(client)

    return asyncio.run(go())


def cmd_status(args: argparse.Namespace) -> int:
    """Print one JSON object (--json) or a short summary."""
    doc = json.loads(_run(args, lambda c: c.status()).json)
    if args.json:
        print(json.dumps(doc, sort_keys=True))
        return EXIT_OK
    group, train = doc.get("group"), doc.get("train")
    print(f"node {doc['node_id']}  role {doc['role']}  term {doc['term']}  leader {doc['leader']}")
    print(f"commit {doc['commit_index']}  applied {doc['last_applied']}  members {len(doc['members'])}")
    if group:
        print(f"group generation {group['generation']}  rank {group['rank']}/{group['world_size']}")
    if train:
        print(f"train step {train['step']}  samples {train['samples']}  loss {train['loss']}")
    if doc.get("control") == "paused":
        print("training is paused (an operator's `dpeer job pause`); `dpeer job resume` trains on")
    no_leader = doc.get("no_leader")
    if no_leader:
        print(f"no leader for {no_leader['since_s']:.0f}s: {no_leader['reason']}")
        if no_leader["action"]:
            print(f"what to do: {no_leader['action']}")
    return EXIT_OK


def cmd_members(args: argparse.Namespace) -> int:
    """Print the members table this node sees, each marked voter, learner or - (not committed)."""
    doc = json.loads(_run(args, lambda c: c.status()).json)
    members, voters, learners = doc["members"], set(doc.get("voters", ())), set(doc.get("learners", ()))
    for m in members:
        m["kind"] = "voter" if m["node_id"] in voters else "learner" if m["node_id"] in learners else None
    if args.json:
        print(json.dumps(members, sort_keys=True))
        return EXIT_OK
    print(f"{'NODE':<20} {'ADDR':<22} {'STATE':<8} {'KIND':<8} {'INC':>4} {'VERSION':>8}")
    for m in members:
        print(f"{m['node_id']:<20} {m['addr']:<22} {m['state']:<8} {m['kind'] or '-':<8} {m['incarnation']:>4} "
              f"{m['version']:>8}")
    return EXIT_OK


def _check_kv(args: argparse.Namespace) -> None:
    """UsageError for a key, value or prefix the node would refuse as too long, before dialling it."""
    from dpeer.statemachine.entry import MAX_KEY, MAX_VALUE
    key = getattr(args, "key", None)
    if key is not None and not 1 <= len(key) <= MAX_KEY:
        raise UsageError(f"KEY must be 1 to {MAX_KEY} characters, not {len(key)}")
    if len(getattr(args, "value", None) or "") > MAX_VALUE:
        raise UsageError(f"VALUE must be at most {MAX_VALUE} characters, not {len(args.value)}")
    if len(getattr(args, "prefix", "")) > MAX_KEY:
        raise UsageError(f"--prefix must be at most {MAX_KEY} characters, not {len(args.prefix)}")


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
        reply = _run(args, lambda c: c.kv_put(args.key, value, timeout=args.timeout))
        if not reply.committed:
            print(f"dpeer: not committed: {reply.reason}", file=sys.stderr)
            return EXIT_NO
        _emit(args, {"key": args.key, "committed": True, "index": reply.index}, f"committed at index {reply.index}")
        return EXIT_OK
    if args.kv_command == "list":
        from dpeer.cli.kv_text import escape
        listed = _run(args, lambda c: c.kv_list(args.prefix))
        pairs = {p.key: p.value for p in listed.pairs}
        _emit(args, pairs, "\n".join(f"{escape(k)}\t{escape(v)}" for k, v in pairs.items()))
        return EXIT_OK
    if args.kv_command == "delete":
        return _kv_delete(args)
    reply = _run(args, lambda c: c.kv_get(args.key))
    if args.json:
        print(json.dumps({"key": args.key, "found": reply.found, "value": reply.value if reply.found else None}))
    elif reply.found:
        print(reply.value)
    if not reply.found:
        if not args.json:
            print(f"dpeer: key {args.key!r} is not set", file=sys.stderr)
        return EXIT_NO
    return EXIT_OK


def _kv_delete(args: argparse.Namespace) -> int:
    """kv delete: exit 1 when the key was not set."""
    deleted = _run(args, lambda c: c.kv_delete(args.key, timeout=args.timeout))
    if args.json or deleted.found:
        _emit(args, {"key": args.key, "found": deleted.found, "index": deleted.index},
              f"deleted at index {deleted.index}")
    if not deleted.found:
        print(f"dpeer: key {args.key!r} is not set", file=sys.stderr)
        return EXIT_NO
    return EXIT_OK


def cmd_force(args: argparse.Namespace) -> int:
    """Forced reconfiguration; refuses without --yes."""
    if not args.yes:
        raise UsageError("force can lose entries that only the lost voters held; add --yes to confirm")
    voters = [v.strip() for v in args.voters.split(",") if v.strip()]
    reply = _run(args, lambda c: c.force(voters))
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
    from dpeer.transport.codec import entry_in
    from dpeer.statemachine.entry import entry_digest

    async def fetch(client: NodeClient) -> tuple[dict[str, Any], list[Any]]:
        doc = json.loads((await client.status()).json)
        lo = doc["first_index"] if args.first is None else max(args.first, doc["first_index"])
        hi = doc["commit_index"] if args.last is None else min(args.last, doc["commit_index"])
        chunks = [c async for c in client.fetch_entries(lo, hi, "")] if lo <= hi else []
        return doc, [entry_in(e) for c in chunks for e in c.entries]

    doc, entries = _run(args, fetch)
    for e in entries:
        row = {"index": e.index, "term": e.term, "kind": e.kind.value, "hash": entry_digest(e)}
        print(json.dumps(row, sort_keys=True) if args.json else f"{e.index:>10} {e.term:>6} {e.kind.value:<14} {row['hash']}")
    if args.first is not None and args.first < doc["first_index"]:
        print(f"dpeer: entries below {doc['first_index']} are compacted on {doc['node_id']} (snapshot at "
              f"{doc['snapshot_index']}); start at --from {doc['first_index']}", file=sys.stderr)
        return EXIT_NO
    if args.last is not None and args.last > doc["commit_index"]:
        print(f"dpeer: entries after {doc['commit_index']} are not committed on {doc['node_id']}", file=sys.stderr)
        return EXIT_NO
    return EXIT_OK


def cmd_leave(args: argparse.Namespace) -> int:
    """Ask the node to leave, or (--node) remove a member gossip holds dead; exit 1 if refused."""
    if args.node:
        return _remove_dead(args)
    reply = _run(args, lambda c: c.leave())
    if not reply.accepted:
        print(f"dpeer: the node did not leave: {reply.reason}", file=sys.stderr)
        return EXIT_NO
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

    refused = _run(args, remove)
    if refused is not None:
        print(f"dpeer: not removed: {refused}", file=sys.stderr)
        return EXIT_NO
    _emit(args, {"removed": args.node}, f"removed {args.node}: its leave is committed and it no longer votes")
    return EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    """`job retry|pause|resume`: commit the job as running again, or pause or resume training;
    exit 1 when refused (not failed, already paused, already running)."""
    action = args.job_command
    reply = _run(args, lambda c: c.job_control(action))
    done = {"retry": "retried", "pause": "paused", "resume": "resumed"}[action]
    if not reply.accepted:
        print(f"dpeer: not {done}: {reply.reason}", file=sys.stderr)
        return EXIT_NO
    _emit(args, {done: True, "reason": reply.reason, "index": reply.index},
          f"{reply.reason} (committed at index {reply.index})")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """Show the effective config or check a file."""
    import yaml

    if args.config_command == "check":
        try:
            cfg.check_file(args.file)
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


def cmd_version(args: argparse.Namespace) -> int:
    """Print the version (the package's), with Python's under --json."""
    _emit(args, {"version": __version__, "python": sys.version.split()[0]}, f"dpeer {__version__}")
    return EXIT_OK


def cmd_start(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM, SIGINT or `dpeer leave`."""
    flags = {
        "node_id": args.node_id, "listen": args.listen, "data_dir": args.data_dir, "join": args.join,
        "advertise": args.advertise, "preset": args.preset, "job": args.job,
        "metrics_listen": args.metrics_listen, "security.insecure": args.insecure,
        "security.insecure_data_plane": args.insecure_data_plane,
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
            from dpeer.daemon.metrics import check_listen
            check_listen(config.metrics_listen)  # before the data dir: a busy port founds no cluster
        from dpeer.daemon import logs
        from dpeer.daemon.data_dir import private_data_dir
        logs.setup(lambda: {"node": config.node_id})
        private_data_dir(config.data_dir)  # before the worker, which inherits its umask
        worker = start_worker_early(config)
        from dpeer.daemon.daemon import run_daemon  # the gRPC stack loads while the worker imports torch

        return run_daemon(config, worker)
    except (OSError, ValueError) as exc:  # the config was accepted: whatever fails now is worth a restart
        raise RuntimeFailure(str(exc)) from exc


def check_security(config: cfg.NodeConfig) -> None:
    """Refuse (exit 2) to start exposed without mutual TLS and token, with a key or token others
    can read, with /metrics in clear off loopback, or with a certificate that names another node;
    before the worker is spawned, so nothing is left running."""
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
    contents = {name: _readable(f"security.{name}", path) for name, path in
                (("tls_cert", s.tls_cert), ("tls_key", s.tls_key), ("tls_ca", s.tls_ca),
                 ("cluster_token_file", s.cluster_token_file)) if path is not None}
    if s.tls_cert is not None:
        from dpeer.security import certs
        try:
            named = certs.identity_of(contents["tls_cert"])
        except certs.CertError as exc:
            raise UsageError(f"security.tls_cert {s.tls_cert}: {exc}") from None
        assert s.tls_key is not None  # all three TLS files or none, checked above
        _check_pair(("security.tls_cert", s.tls_cert, contents["tls_cert"]),
                    ("security.tls_key", s.tls_key, contents["tls_key"]))
        if named != auth.Principal(auth.CallerRole.NODE, config.node_id or ""):
            raise UsageError(f"security.tls_cert {s.tls_cert} names {named}, not node/{config.node_id}; make this "
                             f"node's certificate with `dpeer certs create-node {config.node_id}`")


def _readable(name: str, path: Path) -> bytes:
    """The file's bytes, or UsageError naming the setting and why it cannot be read (say, its mode)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{name} {path} cannot be read: {exc.strerror or exc}") from None


def _check_pair(cert: tuple[str, Path, bytes], key: tuple[str, Path, bytes]) -> None:
    """UsageError unless the key belongs to the certificate; each is (where it was set, path, bytes)."""
    from dpeer.security import certs
    try:
        certs.check_pair(cert[2], key[2])
    except certs.CertError as exc:
        raise UsageError(f"{key[0]} {key[1]} does not go with {cert[0]} {cert[1]}: {exc}; use the key written "
                         "with that certificate (`dpeer certs` writes NAME.pem and NAME.key as a pair)") from None


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
    from dpeer.daemon.supervisor import WorkerSupervisor

    worker = WorkerSupervisor(config.node_id or "", config.job, config.data_dir, config.training,
                              store_bind=config.store_bind)
    worker.start(0.0)
    return worker


def cmd_demo(args: argparse.Namespace) -> int:
    """Start a local cluster training the demo job and show it live."""
    from dpeer.cli.demo import run_demo

    return run_demo(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    """Run a seeded chaos run and its checks; exit 1 on any violation."""
    from dpeer.chaos.command import run_chaos

    return run_chaos(chaos_options(args))


COMMANDS = {
    "start": cmd_start, "status": cmd_status, "members": cmd_members, "kv": cmd_kv,
    "leave": cmd_leave, "force": cmd_force, "log": cmd_log, "config": cmd_config, "demo": cmd_demo, "chaos": cmd_chaos,
    "job": cmd_job, "certs": cmd_certs, "version": cmd_version,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dpeer` command; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, cfg.ConfigError, ValueError) as exc:
        print(f"dpeer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (RuntimeFailure, OSError) as exc:
        print(f"dpeer: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except errors.Unreachable as exc:
        print(f"dpeer: {exc}; is its daemon running?", file=sys.stderr)
        return EXIT_UNREACHABLE
    except errors.Denied as exc:
        print(f"dpeer: refused: {exc}", file=sys.stderr)
        return EXIT_NO
    except errors.PeerError as exc:
        print(f"dpeer: {exc}", file=sys.stderr)
        return EXIT_NO
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
