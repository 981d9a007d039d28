"""A donor SIGKILLed mid-heal: the newcomer keeps the pieces that arrived whole, the next group
(the newcomer and the surviving donor) fetches only the missing ones, and the newcomer ends with
the donors' parameter and optimizer digests."""

from __future__ import annotations

import os
import signal
import threading
import types
from typing import Any

import pytest

from dpeer.trainer import heal_transfer as ht
from dpeer.trainer import state as st

from .test_heal_transfer import CTX, State, _free_port, build, join

SLOW_SENDS = 5  # messages the doomed donor sends (data and checksums, one at a time, once the digests are
# exchanged: a donor lost mid-transfer) before it stalls and the test SIGKILLs it


def resume_rank(rank: int, ports: tuple[int, int], out: Any, doomed: Any) -> None:
    """Rank 0: newcomer at step 0; rank 1: the surviving donor; rank 2: the donor that is killed.

    Rank 2 says it stalled on a pipe of its own (`doomed`): a multiprocessing queue's write lock is
    shared by its writers, and a writer SIGKILLed a moment after its message left, before it let go
    of the lock, would block every later put (the survivors' results never came, about one run in three)."""
    import torch.distributed as dist

    from dpeer.trainer import heal as heal_module
    from dpeer.trainer.heal import HealError, HealSession, heal

    ht.PIECE_BYTES = 1 << 20
    if rank == 2:  # sends go out one by one from a thread, which stalls after a few until the test kills it
        queue: list = []
        wake = threading.Condition()

        class Sent:
            def __init__(self) -> None:
                self.done = threading.Event()

            def wait(self) -> None:
                self.done.wait()

        def sender() -> None:
            for count in range(1 << 30):
                with wake:
                    wake.wait_for(lambda: queue)
                    tensor, dst, sent = queue.pop(0)
                if count == SLOW_SENDS:
                    gathered.wait()  # die after the digests were exchanged, as a donor lost mid-transfer does
                    doomed.send(("stalled", os.getpid()))
                    threading.Event().wait()
                dist.isend(tensor, dst=dst).wait()
                sent.done.set()

        def isend(tensor: Any, dst: int) -> Any:
            sent = Sent()
            with wake:
                queue.append((tensor, dst, sent))
                wake.notify()
            return sent

        gathered = threading.Event()
        real_post = heal_module._post_lineages

        def post(*args: Any) -> Any:  # the digests' exchange runs beside the sends: note when it ends
            mine, lineages = real_post(*args)
            once = threading.Lock()
            box: list = []

            def waited() -> Any:
                with once:
                    if not box:
                        box.append(lineages())
                return box[0]

            threading.Thread(target=lambda: (waited(), gathered.set()), daemon=True).start()
            return mine, waited

        heal_module._post_lineages = post
        threading.Thread(target=sender, daemon=True).start()
        ht.dist = types.SimpleNamespace(isend=isend, irecv=dist.irecv)
    model, opt = build(1 if rank else 2, stepped=rank > 0, width=1536)
    state, session = State(model, opt, 3 if rank else 0), HealSession()
    join(ports[0], rank, 3)
    try:
        heal(rank, 3, state.step, state, session=session)
        out.put(("first heal completed", rank))
        return
    except (HealError, RuntimeError) as exc:
        first = str(exc)
    kept = len(session.partial.done) if session.partial else 0
    dist.destroy_process_group()
    join(ports[1], rank, 2)  # the next generation: the newcomer and the surviving donor
    result = heal(rank, 2, state.step, state, session=session)
    out.put((rank, first, kept, state.step, state.digest(), state.optimizer_digest(), result.received_bytes,
             result.resumed_bytes, session.torn, result.sent_bytes))
    dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_a_donor_killed_mid_heal_leaves_a_heal_that_resumes_with_the_missing_pieces() -> None:
    out = CTX.Queue()
    stall_seen, doomed = CTX.Pipe(duplex=False)
    ports = (_free_port(), _free_port())
    procs = [CTX.Process(target=resume_rank, args=(r, ports, out, doomed)) for r in range(3)]
    for p in procs:
        p.start()
    try:
        assert stall_seen.poll(150), "the doomed donor never stalled"
        stalled = stall_seen.recv()
        assert stalled == ("stalled", procs[2].pid), stalled
        os.kill(procs[2].pid, signal.SIGKILL)
        rows = sorted(out.get(timeout=150) for _ in range(2))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    newcomer, donor = rows
    assert newcomer[0] == 0 and donor[0] == 1, rows
    assert "heal failed" in newcomer[1] and newcomer[2] > 0, newcomer  # it kept pieces from the first try
    assert newcomer[3] == donor[3] == 3
    assert newcomer[4] == donor[4] and newcomer[5] == donor[5]  # parameters and Adam state alike
    assert 0 < newcomer[7] <= newcomer[2] << 20 and not newcomer[8]  # resumed from the pieces it kept, whole again
    model, opt = build(1, stepped=True, width=1536)
    total = st.capture_parts(model, opt).header["payload_len"]
    assert 0 < newcomer[6] == donor[9] == total - newcomer[7]  # the second try moved only the missing pieces
