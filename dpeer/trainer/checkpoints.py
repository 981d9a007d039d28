"""This replica's local checkpoints: resuming from them, and writing them as steps commit.

A resume loads the newest local checkpoint that the plan for the cluster's committed checkpoint
allows (decisions.plan_resume) and that is ahead of the state loaded; a checkpoint is written every
``ckpt_every`` steps and at the last step, its header holding the parameters' digest and lineage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpeer.trainer import state as st
from dpeer.trainer.decisions import plan_resume
from dpeer.trainer.viewsource import Assignment

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer


class Checkpoints:
    """A trainer's checkpoints. resumed_for: the committed (step, digest) the last resume planned
    for; planned: whether a resume ran (this worker holds a trained or resumed state since)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.resumed_for: tuple[int, str] = (0, "")
        self.planned = False

    def committed_hint(self) -> tuple[int, str]:
        """The committed checkpoint the daemon recorded for this worker, if its source offers one."""
        read = getattr(self.trainer.source, "committed_checkpoint", None)
        return read() if read is not None else (0, "")

    def behind(self, given: Assignment) -> bool:
        """Whether the view ``given`` calls for a resume: none ran yet, or it names a newer committed
        checkpoint than the one planned for."""
        return not self.planned or given.checkpoint_step > self.resumed_for[0]

    def resume(self, committed: tuple[int, str]) -> None:
        """Load the newest local checkpoint that the plan for the committed (step, digest) allows
        and that is ahead of the state already loaded (see decisions.plan_resume).

        It runs before the worker reports ready when the daemon recorded a committed checkpoint
        for it (so peers never wait on the load), else at the first view, and again whenever a
        view names a newer committed checkpoint than the one planned for."""
        t = self.trainer
        self.resumed_for, self.planned = committed, True
        if not t.cfg.ckpt_dir:
            return
        local = st.list_checkpoints(t.cfg.ckpt_dir)
        plan = plan_resume([s for s, _ in local], committed[0])
        paths = dict(local)
        for step in plan.steps:
            if step <= t.step:
                break
            blob = self._read(paths[step], committed[1] if step == plan.verify_step else None)
            if blob is not None:
                t.replica.apply(blob)
                t.records.event("checkpoint_loaded", step=t.step, committed=committed[0], reason=plan.reason)
                return
        if t.step == 0:
            t.records.event("checkpoint_none", committed=committed[0], reason=plan.reason)

    def _read(self, path: str, params_digest: str | None) -> st.StateBlob | None:
        """The checkpoint at path when it verifies (and holds `params_digest`, if given); else None."""
        event = self.trainer.records.event
        try:
            blob = st.StateBlob.from_bytes(st.read_checkpoint(path))
        except (st.StateError, OSError, ValueError) as exc:
            event("checkpoint_rejected", path=path, reason=str(exc)[:200])
            return None
        if params_digest is not None and blob.header.get("params_digest") != params_digest:
            event("checkpoint_rejected", path=path, reason="its parameters differ from the committed digest")
            return None
        return blob

    def due(self) -> bool:
        """Whether this step writes a checkpoint (the final one always: a box back after the end fetches it)."""
        t = self.trainer
        final = t.step == t.spec.steps
        return bool(t.cfg.ckpt_dir) and bool(final or (t.cfg.ckpt_every and t.step % t.cfg.ckpt_every == 0))

    def write(self, digest: str) -> None:
        """Write the checkpoint of this step when one is due; `digest` is the step's parameter
        digest when the commit already took it ("" otherwise)."""
        t = self.trainer
        final = t.step == t.spec.steps
        if self.due():
            replica = t.replica
            blob = replica.capture()
            params = digest or replica.digest()
            replica.remember(t.step, params)
            blob.header["params_digest"] = params
            blob.header["lineage"] = sorted(replica.lineage.items())
            _, file_digest = st.write_checkpoint(t.cfg.ckpt_dir, t.step, blob.to_bytes())
            st.prune_checkpoints(t.cfg.ckpt_dir, t.cfg.ckpt_keep, protect=self.committed_hint()[0])
            t.records.event("checkpoint", step=t.step, digest=file_digest, params_digest=params,
                            rank=t.group.membership.rank, final=final)
