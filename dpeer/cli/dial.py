"""How a client command reaches a node: its addresses (--addr, DPEER_ADDR: a comma-separated
list, tried in order), its credentials, and the call itself, moving on to the next address when
one does not answer as a dpeer node."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from dpeer import errors
from dpeer.cli.parser import CLIENT_ENV, DEFAULT_ADDR, UsageError
from dpeer.daemon import config as cfg

if TYPE_CHECKING:  # grpc loads only where a command talks to a node: `start` spawns its worker first
    from dpeer.transport.client import NodeClient
    from dpeer.transport.options import Security


class NoNodeAnswered(errors.Unreachable):
    """Every address of a list failed; the message names each one's failure."""


def node_addrs(args: argparse.Namespace) -> tuple[list[str], str]:
    """The addresses to try in order and where they came from: --addr, else DPEER_ADDR (each a
    comma-separated list), else the --config's advertised address, else the default listen."""
    text, source = args.addr or os.environ.get("DPEER_ADDR", "").strip(), "--addr" if args.addr else "DPEER_ADDR"
    if not text:
        text = cfg.load(args.config).advertise_addr if args.config is not None else DEFAULT_ADDR
        source = "--config" if args.config is not None else "the default address"
    addrs = [a.strip() for a in text.split(",")]
    for addr in addrs:
        try:
            cfg.parse_hostport(addr)
        except ValueError as exc:
            raise UsageError(f"{source}: {exc}" + (f" (in the list {text!r})" if len(addrs) > 1 else "")) from None
    return list(dict.fromkeys(addrs)), source


def one_node(args: argparse.Namespace, command: str) -> None:
    """UsageError when `command` acts on the addressed node itself and the address is a list (a
    fail-over would make it act on another node)."""
    addrs, source = node_addrs(args)
    if len(addrs) > 1:
        raise UsageError(f"{source} names {len(addrs)} nodes, but `dpeer {command}` acts on the node it addresses: "
                         "give that one node with --addr HOST:PORT")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(CLIENT_ENV[name], "").strip()
    return Path(value) if value else None


def security(args: argparse.Namespace) -> Security:
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
            readable(flag, path)
    try:
        made = Security.from_files(*files.values())
    except ValueError as exc:
        raise UsageError(str(exc).replace("security.tls_cert, tls_key and tls_ca", "--tls-cert, --tls-key and --tls-ca"))
    cert, key = files["--tls-cert"], files["--tls-key"]
    if made.cert is not None and made.key is not None and cert is not None and key is not None:
        check_pair(("--tls-cert", cert, made.cert), ("--tls-key", key, made.key))
    return made


def readable(name: str, path: Path) -> bytes:
    """The file's bytes, or UsageError naming the setting and why it cannot be read (say, its mode)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{name} {path} cannot be read: {exc.strerror or exc}") from None


def check_pair(cert: tuple[str, Path, bytes], key: tuple[str, Path, bytes]) -> None:
    """UsageError unless the key belongs to the certificate; each is (where it was set, path, bytes)."""
    from dpeer.security import certs
    try:
        certs.check_pair(cert[2], key[2])
    except certs.CertError as exc:
        raise UsageError(f"{key[0]} {key[1]} does not go with {cert[0]} {cert[1]}: {exc}; use the key written "
                         "with that certificate (`dpeer certs` writes NAME.pem and NAME.key as a pair)") from None


def run(args: argparse.Namespace, call: Callable[[NodeClient], Awaitable[Any]], writes: bool = False) -> Any:
    """call() on the first node of the address list that answers as a dpeer node. A read moves on
    to the next address whenever one is unreachable; a write (writes=True) is sent once, to the
    first node that answers a status call, so a node that got it but answered too late is never
    sent it again through another."""
    import asyncio

    from dpeer.transport.client import NodeClient

    addrs, source = node_addrs(args)
    creds = security(args)

    async def go() -> Any:
        failures: list[errors.Unreachable] = []
        for addr in addrs:
            async with NodeClient(addr, creds, timeout=args.timeout) as client:
                try:
                    if not (writes and len(addrs) > 1):
                        return await call(client)
                    await client.status()
                except errors.Unreachable as exc:
                    failures.append(exc)
                    continue
                return await call(client)
        if len(failures) == 1:
            raise failures[0]
        raise NoNodeAnswered(f"no node in {source} answered: " + "; ".join(str(f) for f in failures))

    return asyncio.run(go())
