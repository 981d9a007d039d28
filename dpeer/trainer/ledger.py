"""The worker's ledger file: what this rank trained and committed, one JSON line a record, folded
into ranges once a committed checkpoint covers the steps, so it stays small however long the run.

A step leaves a ``trained`` record (written before its sums can leave: the line reaches the kernel
before the step can commit anywhere), a ``committed`` record, and every digest_every-th step a
``digest`` record (audit.py says what each holds). ``compact`` folds the steps below a bound that
this rank both trained and committed into one ``range`` record per run of consecutive steps of one
(generation, world, rank)::

    {"kind": "range", "gen", "world", "rank", "first", "last", "trained": FINGERPRINT,
     "digest_steps": [STEP, ...], "digests": [DIGEST, ...]}

with the generation's "shares" too when they are not even (as in its trained records).

``trained`` chains a sha256 over each step's ``[step, micro_batches, indices]`` as recorded, so the
audit still proves, from the sampler, that the rank fed exactly its seeded share of every step.
``digests`` (of the steps ``digest_steps``: two flat lists, quick to rewrite) keeps the digests of
the committed records (checkpoint and last steps) and of the run's first step (a group's first
step, digested after its heal), the newest DIGESTS_KEPT of them over all ranges. Dropped: the
losses, the other digest_every digests, older digests, and a mismatch's exact step (the audit names
the range). Anything else (a trained record without its commit, from a rank killed mid-step) stays
as it was. So a ledger holds its tail in full, about 0.3 KB a generation and at most DIGESTS_KEPT
digests (70 bytes each).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import threading
from typing import Any

from dpeer.channel.checkpoint_files import fsync_dir

TRAINED, COMMITTED, DIGEST, RANGE = "trained", "committed", "digest", "range"
DIGESTS_KEPT = 10_000  # digests the folded head keeps, the newest (2.3 days of checkpoints every 20 s)
_Key = tuple[int, int, int, int]  # step, generation, world, rank


def share_print(previous: str, step: int, micro_batches: list[int] | None, indices: list[int]) -> str:
    """The next link of a range's fingerprint: sha256 over the previous one and this step's record."""
    return hashlib.sha256((previous + json.dumps([step, micro_batches, indices])).encode()).hexdigest()


def _key(record: dict[str, Any]) -> _Key | None:
    """(step, gen, world, rank) of a per-step record, None for anything else."""
    try:
        key = (record["step"], record["gen"], record["world"], record["rank"])
    except KeyError:
        return None
    return key if all(type(v) is int for v in key) else None


def compact(lines: list[str], below: int) -> list[str] | None:
    """The ledger's lines with every step below ``below`` that this rank trained and committed
    (one record of each) folded into range records; None when there is nothing to fold. Order is
    kept: a new range stands where its first trained record stood. Torn lines are dropped."""
    slots: list[str | dict[str, Any]] = []
    by_key: dict[_Key, dict[str, list[tuple[int, dict[str, Any]]]]] = {}
    open_ranges: dict[tuple[int, int, int], dict[str, Any]] = {}  # (gen, world, rank) -> its newest range
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("kind") == RANGE:
            open_ranges[(record["gen"], record["world"], record["rank"])] = record
            slots.append(record)
            continue
        key = _key(record) if isinstance(record, dict) else None
        if key is not None and key[0] < below and record.get("kind") in (TRAINED, COMMITTED, DIGEST):
            by_key.setdefault(key, {}).setdefault(record["kind"], []).append((len(slots), record))
        slots.append(line)
    foldable = sorted((k for k, kinds in by_key.items()
                       if len(kinds.get(TRAINED, ())) == 1 and len(kinds.get(COMMITTED, ())) == 1),
                      key=lambda k: (k[1], k[2], k[3], k[0]))
    for key in foldable:
        _fold(key, by_key[key], slots, open_ranges)
    late = [(k, r) for k, kinds in by_key.items() if set(kinds) == {DIGEST}
            and (r := open_ranges.get(k[1:])) is not None and r["first"] <= k[0] <= r["last"]]
    if not foldable and not late:
        return None
    for key, run in late:  # a digest hashed beside the step after a fold's bound: folded too
        for where, record in by_key[key][DIGEST]:
            if key[0] == run["first"] and record.get("digest"):
                run["digest_steps"].append(key[0])
                run["digests"].append(record["digest"])
            slots[where] = None
    _keep_newest_digests([s for s in slots if isinstance(s, dict)])
    return [s if isinstance(s, str) else json.dumps(s) for s in slots if s is not None]


def range_digests(r: dict[str, Any]) -> list[tuple[int, str]]:
    """A range's kept (step, digest) pairs, in step order."""
    return list(zip(r["digest_steps"], r["digests"]))


def _keep_newest_digests(ranges: list[dict[str, Any]]) -> None:
    """Sort each range's digests by step and drop the oldest beyond DIGESTS_KEPT over all ranges."""
    steps = sorted(s for r in ranges for s in r["digest_steps"])
    oldest_kept = steps[-DIGESTS_KEPT] if len(steps) > DIGESTS_KEPT else -1
    for r in ranges:
        pairs = sorted(p for p in range_digests(r) if p[0] >= oldest_kept)
        r["digest_steps"], r["digests"] = [p[0] for p in pairs], [p[1] for p in pairs]


def _fold(key: _Key, kinds: dict[str, list[tuple[int, dict[str, Any]]]], slots: list[Any],
          open_ranges: dict[tuple[int, int, int], dict[str, Any]]) -> None:
    """Fold one step's records into its run's range (extended, or started in the trained record's slot)."""
    step, gen, world, rank = key
    (at, trained), (done, committed) = kinds[TRAINED][0], kinds[COMMITTED][0]
    run = open_ranges.get((gen, world, rank))
    if run is None or run["last"] != step - 1:
        run = {"kind": RANGE, "gen": gen, "world": world, "rank": rank, "first": step, "last": step - 1,
               "trained": "", "digest_steps": [], "digests": []}
        if trained.get("shares"):  # a generation's shares are one (its view's)
            run["shares"] = trained["shares"]
        open_ranges[(gen, world, rank)] = run
        slots[at] = run
    else:
        slots[at] = None
    run["last"] = step
    run["trained"] = share_print(run["trained"], step, trained.get("micro_batches"), trained.get("indices"))
    slots[done] = None
    kept = [committed.get("digest")] + [d.get("digest") for _, d in kinds.get(DIGEST, ()) if step == run["first"]]
    for digest in kept:
        if digest and isinstance(digest, str):
            run["digest_steps"].append(step)
            run["digests"].append(digest)
    for where, _ in kinds.get(DIGEST, ()):
        slots[where] = None


class LedgerFile:
    """The ledger this worker appends to: one line-buffered write a record (in the kernel when
    ``write`` returns, never held in user space). ``fold_later`` compacts it on a thread of its
    own, off the step's path: the folded text is written and synced beside it, then, with writes
    held for a moment, the records appended meanwhile are copied after it and it is renamed over
    the ledger, so a kill at any point leaves one whole ledger with every record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Any = None
        self._lock = threading.Lock()  # held by a write, and by a fold while it swaps the files
        self._wanted = 0  # the newest bound a fold was asked for
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        line = json.dumps(record) + "\n"
        with self._lock:
            if self._file is None:
                self._file = self._open()
            self._file.write(line)

    def _open(self) -> Any:
        """Open for appending: a torn last line (a kill mid-write) is ended first, so the next
        record is not glued to it, and temp files of a fold a kill interrupted are removed."""
        mine = f"{self.path}.{os.getpid()}.tmp"  # a fold of this process's under way
        for stale in glob.glob(glob.escape(self.path) + ".*.tmp"):
            if stale != mine:
                os.remove(stale)
        f = open(self.path, "a", buffering=1)  # noqa: SIM115 (lives with the worker)
        if f.tell() > 0:
            with open(self.path, "rb") as tail:
                tail.seek(-1, os.SEEK_END)
                if tail.read(1) != b"\n":
                    f.write("\n")
        return f

    def fold_later(self, below: int) -> None:
        """Ask the folding thread to fold the steps below ``below`` (see compact)."""
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ledger-fold", daemon=True)
                self._thread.start()
            self._wanted = max(self._wanted, below)
            self._wake.notify()

    def _run(self) -> None:
        done = 0
        while True:
            with self._wake:
                while self._wanted <= done and not self._closing:
                    self._wake.wait()
                if self._wanted <= done:
                    return
                below = done = self._wanted
            try:
                self.fold(below)
            except OSError as exc:  # the ledger stays as it was, whole; the next fold tries again
                print(f"dpeer worker: could not fold the ledger {self.path}: {exc}", file=sys.stderr, flush=True)

    def fold(self, below: int) -> bool:
        """Fold the steps below ``below`` now; True when the ledger was rewritten."""
        with self._lock:
            if self._file is not None:
                size = self._file.tell()
            elif os.path.exists(self.path):
                size = os.path.getsize(self.path)
            else:
                return False
        with open(self.path, "rb") as f:
            head = f.read(size)
        folded = compact(head.decode(errors="replace").splitlines(), below)
        if folded is None:
            return False
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as out:
            out.write("".join(line + "\n" for line in folded).encode())
            out.flush()
            os.fsync(out.fileno())
            with self._lock:  # the records written since the read follow, then the swap
                with open(self.path, "rb") as f:
                    f.seek(size)
                    out.write(f.read())
                out.flush()
                os.replace(tmp, self.path)
                if self._file is not None:
                    self._file.close()
                    self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (lives with the worker)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        return True

    def close(self) -> None:
        """Let a fold under way finish, then close the file (its records are in the kernel already)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
