"""What the step loop writes down and reports: the ledger, the events, the progress and the digests.

The ledger (ledger.py) holds, per step and rank, what the rank trained (written before the step's
sums can leave, so the audit sees it even when the rank dies right after) and the committed step
with its loss and, every ``digest_every`` steps, the parameters' digest. A digest not needed at
once (by a checkpoint, or the last step) is hashed on a thread while the next step computes
(digests.py) and settled before anything writes the parameters.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from dpeer.trainer import state as st
from dpeer.trainer.digests import BackgroundDigest
from dpeer.trainer.group import GroupSeat
from dpeer.trainer.heal import HealProgress
from dpeer.trainer.ledger import LedgerFile
from dpeer.trainer.stepping import Trained

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer

FOLD_EVERY = 1000  # steps between ledger compactions when no checkpoints are written (else at each checkpoint)


class Records:
    """A trainer's records. ledger: its ledger file (None: none kept), folded into ranges below
    folded_below; digests: the digest hashed on a thread, of a step committed by the group
    digest_seat; digest_next: the next committed step is digested whatever its number (a group's first)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.ledger = LedgerFile(trainer.cfg.ledger_path) if trainer.cfg.ledger_path else None
        self.folded_below = 0
        self.digest_next = False
        self.digests = BackgroundDigest()
        self.digest_seat: Any = None

    def event(self, kind: str, **fields: Any) -> None:
        """Report an event to the daemon, when the source takes events."""
        report = getattr(self.trainer.source, "report_event", None)
        if report is not None:
            report(kind, **fields)

    def heal_progress(self, p: HealProgress) -> None:
        """A long heal's progress: a report record, and a line in the daemon's log (the worker's stderr)."""
        generation = self.trainer.generation
        self.event("heal_progress", gen=generation, done_bytes=p.done_bytes, total_bytes=p.total_bytes,
                   seconds=round(p.seconds, 3), donors=p.donors)
        how = f"from {p.donors} donor(s)" if p.donors else "sent to the ranks behind"  # 0 donors: this rank donates
        print(f"dpeer worker: healing in generation {generation}: {p.done_bytes / 1e6:.0f} of "
              f"{p.total_bytes / 1e6:.0f} MB {how} in {p.seconds:.1f} s", file=sys.stderr, flush=True)

    def report_pause(self) -> None:
        """Training is paused: say at which step, with that step's digest once this worker holds a
        trained or resumed state, so every box's status shows where its replica holds (not as
        progress: no step was committed)."""
        t = self.trainer
        self.event("paused", gen=t.generation, step=t.step, samples=t.sampler.cursor_after(t.step),
                   loss=t.last_loss, digest=t.replica.digest() if t.checkpoints.planned else "")

    def write(self, entry: dict[str, Any]) -> None:
        """Append one ledger record: one line-buffered write, no open/close per step."""
        if self.ledger is not None:
            self.ledger.write(entry)

    def trained(self, trained: Trained, membership: GroupSeat) -> None:
        """Before the step's allreduce, record what this rank trained (its micro-batches and their
        samples, and the generation's shares when they are not even), so the audit sees it even when
        the rank dies right after the step commits."""
        shares = {"shares": list(membership.shares)} if membership.shares else {}
        self.write({"kind": "trained", "step": trained.step, "gen": membership.generation,
                    "world": membership.world, "rank": membership.rank, **shares,
                    "micro_batches": trained.micro_batches, "indices": trained.indices})

    def committed(self, m: GroupSeat) -> str:
        """The trainer counted a committed step: digest it (now when a checkpoint or the job's end
        needs it, else on the thread), record it and report the progress; returns the digest taken now."""
        t = self.trainer
        digested = self.digest_next or t.step % t.cfg.digest_every == 0 or t.step == t.spec.steps
        self.digest_next = False
        digest = ""
        if digested and (t.checkpoints.due() or t.step == t.spec.steps):
            digest = t.replica.digest()  # the checkpoint's header (and the job's end) needs it now
        elif digested:
            self.digests.start(t.step, st.digest_later(t.spec.model))
            self.digest_seat = m
        self.write({"kind": "committed", "step": t.step - 1, "gen": m.generation,
                    "world": m.world, "rank": m.rank, "digest": digest, "loss": t.last_loss})
        t.source.report_progress(t.step, t.sampler.cursor_after(t.step), t.last_loss, digest)
        return digest

    def settle_digest(self) -> None:
        """Record the digest hashed while this step computed (the ledger, then the status), if any;
        before anything writes the parameters (the optimizer's step, a heal, a resume)."""
        done = self.digests.settle()
        if done is None:
            return
        (step, digest), m, t = done, self.digest_seat, self.trainer
        self.write({"kind": "digest", "step": step - 1, "gen": m.generation, "world": m.world, "rank": m.rank,
                    "digest": digest})
        self.event("digest", step=step, samples=t.sampler.cursor_after(step), loss=t.last_loss, digest=digest)

    def fold(self) -> None:
        """Fold the ledger's steps that a committed checkpoint covers into ranges (ledger.py), at
        each checkpoint this worker writes: those below the committed checkpoint, or below this
        worker's previous checkpoint when the commit lags further (the tail stays within two
        intervals; a range keeps what the audit needs either way). Without checkpoints, every
        FOLD_EVERY steps, up to this one."""
        if self.ledger is None:
            return
        t = self.trainer
        if t.cfg.ckpt_dir and t.cfg.ckpt_every:
            committed = max(t.checkpoints.committed_hint()[0], t.step - t.cfg.ckpt_every)
            below = min(committed, t.step) if t.checkpoints.due() else 0
        else:
            below = t.step if t.step % FOLD_EVERY == 0 else 0
        if below > self.folded_below:
            self.ledger.fold_later(below)
            self.folded_below = below

    def close(self) -> None:
        """Close the ledger (the loop's last act)."""
        if self.ledger is not None:
            self.ledger.close()
