"""Child process for test_sm_crash: appends durably in a bounded loop, printing each acknowledged
index after the call that made it durable returns. Usage: sm_crash_child.py PATH MODE SEED."""

from __future__ import annotations

import random
import sys

from tests.support.sm_entries import expected_entry

from dpeer.statemachine.store import Store

MAX_ENTRIES = 200_000


def main(path: str, mode: str, seed: int) -> None:
    rng = random.Random(seed)
    with Store.open(path, node_id="crash") as store:
        written = 0
        while written < MAX_ENTRIES:
            lo = store.last_index + 1
            batch = [expected_entry(i) for i in range(lo, lo + rng.randint(1, 8))]
            store.append(batch)
            print(f"A {batch[-1].index}", flush=True)
            written += len(batch)
            if mode in ("apply", "snapshot"):
                store.set_commit(batch[-1].index)
                store.apply_to(batch[-1].index)
            if mode == "snapshot":
                store.maybe_snapshot(every=25, keep_tail=rng.randint(0, 10))
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
