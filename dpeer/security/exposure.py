"""Secure unless told otherwise: whether a node may start with the security it is configured with.

Pure. A node whose listen address is not loopback needs mutual TLS and a cluster token, or an
explicit `--insecure` (as CockroachDB's); a cluster token never travels without TLS off loopback,
where anyone on the path would read it. Loopback clusters (the demo, the tests) may run without.
A job's data plane (Gloo's collectives and the heal between workers) authenticates every
connection with the generation's key but does not encrypt: off loopback, a secured node trains
only with an explicit `--insecure-data-plane` that says so.
"""

from __future__ import annotations

from ipaddress import ip_address

from dpeer.security.auth import Mode

HOW = ("make a CA, a token and this node's certificate with `dpeer certs create-ca` and "
       "`dpeer certs create-node NODE_ID --host HOST` and name them in the config's security block "
       "(tls_ca, tls_cert, tls_key, cluster_token_file)")


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback ranges (127.0.0.0/8, ::1); names other than localhost are not."""
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refusal(listen_host: str, mode: Mode, insecure: bool) -> str | None:
    """The one-sentence reason this node must not start, or None when it may."""
    if is_loopback(listen_host):
        return None
    if mode is Mode.TOKEN:
        return (f"listening on {listen_host} (not loopback) with a cluster token but without TLS would send the "
                f"token in clear; {HOW}")
    if mode is Mode.MTLS_TOKEN or insecure:
        return None
    missing = "a cluster token" if mode is Mode.MTLS else "mutual TLS and a cluster token"
    return (f"listening on {listen_host} (not loopback) needs {missing}: {HOW}, or pass --insecure to run "
            "without, letting anyone who reaches the port control the node")


def warning(listen_host: str, mode: Mode, insecure: bool) -> str | None:
    """The warning a node started with --insecure logs at every start, None when it has nothing to warn of."""
    if not insecure or mode is Mode.MTLS_TOKEN:
        return None
    where = "on loopback" if is_loopback(listen_host) else f"on {listen_host}"
    return (f"INSECURE: started with --insecure {where} with security {mode.value}: anyone who reaches this "
            "port can make this node leave, change settings and speak for any member")


def data_plane_refusal(data_host: str, runs_job: bool, insecure: bool, insecure_data_plane: bool) -> str | None:
    """The one-sentence reason a secured node must not run its job's data plane on data_host, or None."""
    if not runs_job or is_loopback(data_host) or insecure or insecure_data_plane:
        return None
    return (f"the job's data plane (collectives and heal between workers) would run on {data_host}, not loopback: "
            "its connections prove the generation's key but travel unencrypted, so anyone on the path could "
            "read gradients and model state; put the boxes on an encrypted network (WireGuard, IPsec) and pass "
            "--insecure-data-plane (security.insecure_data_plane), or run the job on loopback")


def data_plane_warning(data_host: str, runs_job: bool, insecure: bool, insecure_data_plane: bool) -> str | None:
    """The warning a node whose data plane leaves loopback unencrypted logs at every start, else None."""
    if not runs_job or is_loopback(data_host) or not (insecure or insecure_data_plane):
        return None
    return (f"INSECURE DATA PLANE: the job's collectives and heal on {data_host} travel unencrypted (their "
            "connections prove the generation's key); anyone on the path can read gradients and model state")
