"""Process-group (re)formation in place, one generation at a time.

A rendezvous store outlives the groups: the worker of the view's first member serves it on
``view.store`` (bound to exactly its own configured address; rendezvous_server), the others keep
one authenticated connection per store address (rendezvous). Each generation has a key space of
its own (a reused one hangs, pytorch#55967) that only requests tagged with the key derived from
the generation's secret reach, so a stranger can neither read nor write what a group forms from.
Once formed, every pair of ranks proves the generation's key over its own Gloo connection
(pair_auth), so a stranger who connected first in a rank's place is found before any gradient or
heal piece crosses. Gloo binds the configured address only. Re-forming drops every reference to the old group, destroys it and
runs ``gc.collect()`` before the new ``init_process_group``: a live traceback keeps the old group
alive and leaves other survivors blocked (pytorch#107298, docs/architecture.md "Decisions").

NCCL (when CUDA is present) cannot be destroyed safely after a failure: the watchdog's teardown is
turned off (TORCH_NCCL_ASYNC_ERROR_HANDLING=0, blocking wait so timeouts raise in the caller),
``abort`` runs under a watchdog thread and the process exits with ``EXIT_RESTART`` if it does not
return in time, so the daemon restarts the worker. Only the single-GPU path is checked, by
``python -m dpeer.trainer.gpu_check``.
"""

from __future__ import annotations

import datetime as dt
import gc
import hashlib
import hmac
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
# torch._dynamo's first import (torch.optim makes it when the first optimizer is built) keeps the
# group alive then in C++ past destroy_process_group (torch 2.13): its Gloo threads run on, and it
# is destroyed only during the interpreter's finalization, where a Gloo thread can abort the
# process ("terminate called without an active exception", exit -6). Imported with this module,
# it comes before any group, so every group is released when destroyed.
import torch._dynamo  # noqa: F401
import torch.distributed as dist

from dpeer import procfs
from dpeer.trainer import gloo_cut
from dpeer.trainer.pair_auth import authenticate_pairs
from dpeer.trainer.rendezvous import GenerationStore, RendezvousClient, RendezvousError
from dpeer.trainer.rendezvous_server import RendezvousServer
from dpeer.view import View

EXIT_RESTART = 75
RENDEZVOUS_POLL_S = 0.002
STORE_POLL_S = 0.005
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class GroupError(RuntimeError):
    """The group could not be formed or a collective in it failed; the text is the reason."""


class Superseded(GroupError):
    """A newer view was committed while this generation was forming; not a failure."""


@dataclass(frozen=True)
class GroupSeat:
    """This process's place in the formed group; heal_key authenticates the heal stream (b"" when the
    view carried no secret); shares weigh each rank's part of a step (View.shares; empty: even)."""

    generation: int
    rank: int
    world: int
    members: tuple[str, ...]
    heal_key: bytes = b""
    shares: tuple[int, ...] = ()


def derive(secret: str, purpose: str, generation: int) -> bytes:
    """A key for one purpose of one generation from its secret (HMAC-SHA256), so the secret itself
    never crosses the data plane, which has no encryption."""
    return hmac.new(secret.encode(), f"dpeer/{purpose}/{generation}".encode(), hashlib.sha256).digest()


class _BoundGloo:
    """Gloo with its device bound to one address: torch pins Gloo only to a whole interface
    (GLOO_SOCKET_IFNAME), which may hold other addresses; a registered backend can pass the device."""

    name = "dpeergloo"
    host: str | None = None

    @classmethod
    def on(cls, host: str) -> str:
        """The backend name that makes this process's next group listen on exactly host."""
        if cls.host is None:
            dist.Backend.register_backend(cls.name, cls._make, devices=["cpu"])
        cls.host = host
        return cls.name

    @classmethod
    def _make(cls, store: dist.Store, rank: int, size: int, timeout: dt.timedelta) -> dist.ProcessGroupGloo:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=cls.host)]
        return dist.ProcessGroupGloo(store, rank, size, options)


def _listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def bind_store_socket(host: str, port: int) -> socket.socket:
    """The listening socket of the rendezvous store this worker hosts when it is rank 0, bound at
    start so its port (any free one for port 0) is known before any view names it and nothing
    else can take it; OSError with one sentence naming the address when it cannot be bound."""
    try:
        return _listen_socket(host, port)
    except OSError as exc:
        advice = ("free it, set another store_port in the config, or leave store_port unset so the worker takes "
                  "any free port" if port else "the advertised host must be an address of this machine")
        raise OSError(f"cannot bind the rendezvous store's port {host}:{port} ({exc.strerror or exc}); "
                      f"{advice}") from None


class GroupManager:
    """Forms the torch.distributed group of each committed view, reusing one store per address."""

    def __init__(
        self,
        node_id: str,
        backend: str | None = None,
        init_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        abort_timeout: float = 10.0,
        store_socket: socket.socket | None = None,
    ) -> None:
        self.node_id = node_id
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.init_timeout = init_timeout
        self.connect_timeout = connect_timeout
        self.abort_timeout = abort_timeout
        self.membership: GroupSeat | None = None
        self._hosted: dict[tuple[str, int], RendezvousServer] = {}
        self._bound = store_socket  # bound at start (bind_store_socket); used when a view names its port
        self._clients: dict[tuple[str, int], RendezvousClient] = {}
        self._collective_timeout = init_timeout
        self._pairs: gloo_cut.GroupSockets | None = None  # the current Gloo group's connections
        self._judged: dict[int, bool] = {}  # socket inode -> a stranger's connection? (foreign_connections)

    @property
    def device(self) -> torch.device:
        """The device collectives run on (cuda for NCCL, cpu for Gloo)."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _host_store(self, host: str, port: int) -> RendezvousServer:
        key = (host, port)
        if key not in self._hosted:
            try:
                sock = self._take_bound(port) or _listen_socket(host, port)
            except OSError as exc:
                raise GroupError(f"cannot host the store on {host}:{port}: {exc.strerror or exc}") from None
            self._hosted[key] = RendezvousServer(sock)
        return self._hosted[key]

    def _take_bound(self, port: int) -> socket.socket | None:
        """The socket bound at start when the view names its port (it is then hosted for good)."""
        if self._bound is None or self._bound.getsockname()[1] != port:
            return None
        sock, self._bound = self._bound, None
        return sock

    def _client_store(self, host: str, port: int, deadline: float, superseded: Callable[[], bool]) -> RendezvousClient:
        """The connection to the store at host:port, opened once it listens (a member may reach a new
        rank 0 before its worker hosts the store), until deadline or a newer view."""
        client = self._clients.setdefault((host, port), RendezvousClient(host, port))
        last = ""
        while time.monotonic() < deadline:
            if superseded():
                raise Superseded(f"a newer view arrived while connecting to store {host}:{port}")
            try:
                client.connect(min(1.0, max(0.05, deadline - time.monotonic())))
                return client
            except RendezvousError as exc:
                raise GroupError(str(exc)) from None
            except OSError as exc:
                last = f"the store does not accept connections yet ({exc.strerror or exc})"
            time.sleep(STORE_POLL_S)
        raise GroupError(f"could not reach store {host}:{port}: {last}")

    def _rendezvous(self, store: dist.Store, view: View, superseded: Callable[[], bool], deadline: float) -> None:
        """Wait until every member arrived, giving up as soon as a newer view exists.

        The outcome is sealed once, with compare_set: "go" by the first member to count every
        arrival, "abandoned" by the first to give up. A member never gives up after another went
        on to init (that one would wait out the init timeout on a rank that never comes); a group
        formed on a superseded view switches to the newer one at its first step.
        """
        world = len(view.members)
        arrived = store.add("arrived", 1)
        while arrived < world:
            late = superseded()
            if late or time.monotonic() > deadline:
                if store.compare_set("sealed", "", "abandoned") == b"go":
                    return
                if late:
                    raise Superseded(f"generation {view.generation} superseded during rendezvous")
                raise GroupError(f"generation {view.generation}: {arrived}/{world} members arrived in time")
            time.sleep(RENDEZVOUS_POLL_S)
            arrived = store.add("arrived", 0)
        if store.compare_set("sealed", "", "go") != b"go":
            raise Superseded(f"generation {view.generation} was abandoned by a member before it formed")

    def form(self, view: View, superseded: Callable[[], bool] = lambda: False, bind_host: str = "") -> GroupSeat:
        """Destroy any current group and form the one of ``view`` (this node must be a member); the
        data plane binds ``bind_host`` ("" for the store host's own rule).

        ``superseded`` is polled while waiting for the other members; returning True abandons
        this generation (a newer view was committed) instead of waiting out the init timeout.
        """
        self.destroy()
        rank = view.rank_of(self.node_id)
        if rank is None:
            raise GroupError(f"{self.node_id} is not a member of generation {view.generation}")
        backend = self.backend
        if self.backend == "gloo" and bind_host:
            backend = _BoundGloo.on(bind_host)
        elif self.backend == "gloo" and view.store.host in _LOOPBACK:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if self.backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        deadline = time.monotonic() + self.init_timeout
        key = derive(view.secret, "rendezvous", view.generation)
        host = view.store.host
        if rank == 0:
            host = bind_host or view.store.host
            self._host_store(host, view.store.port).allow(view.generation, key)
        client = self._client_store(host, view.store.port, deadline, superseded)
        store = GenerationStore(client, view.generation, key, self.init_timeout, _giving_up(superseded, view.generation))
        failure: GroupError | None = None
        try:
            self._rendezvous(store, view, superseded, deadline)
            store.give_up = lambda: None  # sealed "go": every member goes on to init, none may leave now
            before = set(procfs.sockets()) if self.backend == "gloo" else set()
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=len(view.members),
                timeout=dt.timedelta(seconds=self.init_timeout),
                device_id=self.device if self.backend == "nccl" else None,
            )
            authenticate_pairs(rank, len(view.members), derive(view.secret, "pair", view.generation), self.device)
        except GroupError as exc:
            failure = type(exc)(str(exc))
        except (RuntimeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else repr(exc)
            failure = GroupError(f"init of generation {view.generation} failed: {first}")
        if failure is not None:
            self.destroy()
            raise failure
        if self.backend == "gloo":
            ports = {view.store.port} | {port for _, port in (*self._clients, *self._hosted)}
            self._pairs = gloo_cut.GroupSockets.established(before, ports)
            self._judged = {}
        heal_key = derive(view.secret, "heal", view.generation) if view.secret else b""
        self.membership = GroupSeat(view.generation, rank, len(view.members), view.members, heal_key, view.shares)
        self.set_timeout(self._collective_timeout)
        return self.membership

    def set_timeout(self, seconds: float) -> None:
        """Set the timeout of collectives in the current group."""
        self._collective_timeout = seconds
        if dist.is_initialized():
            dist.distributed_c10d._set_pg_timeout(dt.timedelta(seconds=seconds))

    def cutter(self) -> Callable[[], int]:
        """What fails the current Gloo group's pending operations, here and on its peers, when
        called (Gloo has no abort: its connections are shut down, gloo_cut), returning how many
        were; bound to this group, so a call that comes late never touches the next one. Safe from
        another thread while a collective runs; the group must then be destroyed as after any failure."""
        pairs = self._pairs
        return pairs.cut if pairs is not None else (lambda: 0)

    def foreign_connections(self) -> int:
        """How many connections to this process's data-plane ports came from outside the current
        Gloo group (0 without one): a stranger's, which Gloo's listener holds until the group goes."""
        if self._pairs is None:
            return 0
        return gloo_cut.foreign_connections(set(self._pairs.sockets), {port for _, port in (*self._clients, *self._hosted)},
                                            self._judged)

    def _abort_nccl_or_exit(self) -> None:
        done = threading.Event()

        def _abort() -> None:
            dist.distributed_c10d._abort_process_group()
            done.set()

        threading.Thread(target=_abort, daemon=True).start()
        if not done.wait(self.abort_timeout):
            os._exit(EXIT_RESTART)

    def destroy(self) -> None:
        """Release the current group (abort under a watchdog for NCCL) and collect garbage.

        Call ``gc.freeze()`` once the job is built, so this collection only scans young objects.
        """
        self.membership, self._pairs = None, None
        if not dist.is_initialized():
            _reset_group_names()
            return
        if self.backend == "nccl":
            self._abort_nccl_or_exit()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()

    def close(self) -> None:
        """Destroy the group and close every store this process hosts or uses."""
        self.destroy()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for server in self._hosted.values():
            server.close()
        self._hosted.clear()
        if self._bound is not None:
            self._bound.close()
            self._bound = None


def _giving_up(superseded: Callable[[], bool], generation: int) -> Callable[[], BaseException | None]:
    """What a store request that cannot be served yet gives up with once a newer view came."""
    def check() -> BaseException | None:
        return Superseded(f"generation {generation} superseded while its store was not ready") if superseded() else None
    return check


def _reset_group_names() -> None:
    """Start group naming afresh after a failed init.

    torch names the default group from a counter it bumps before the rendezvous and resets only
    when a fully formed group is destroyed; after one failed init this rank would use group
    name "1" while its peers use "0", its store keys would never match theirs, and every later
    init would time out (found by the chaos run, BENCHMARKS.md "Chaos").
    """
    dist.distributed_c10d._world.group_count = 0
