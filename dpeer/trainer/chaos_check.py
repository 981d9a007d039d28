"""Training-side checks of a `dpeer chaos` run (dpeer/peer/chaos/), run as a child process:
``python -m dpeer.trainer.chaos_check`` reads a JSON spec on stdin and prints a JSON result.

It lives in the trainer layer because it reads ledgers and torch state dicts; the chaos driver in
dpeer/peer stays free of torch and of trainer imports (DESIGN.md "Layers"), as the worker
supervisor does with ``python -m dpeer.trainer.worker``.

spec: {"ledgers": {NAME: PATH}, "finals": {NODE: PATH}, "steps", "global_batch",
       "reference_final": PATH|null, "reference_ledger": PATH|null, "exact_horizon", "max_rel_diff"}
result: {"audit": [violations], "final": [violations], "figures": {...}}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MAX_REL_DIFF = 1e-4


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Audit the ledgers, compare the final models with each other and with the reference."""
    import torch

    from dpeer.peer.config import TrainingConfig
    from dpeer.trainer.audit import audit, read_ledger
    from dpeer.trainer.demo import DEFAULTS
    from dpeer.trainer.sampler import GlobalBatchSampler

    limit = float(spec.get("max_rel_diff", MAX_REL_DIFF))
    steps, batch, length = int(spec["steps"]), int(spec["global_batch"]), int(DEFAULTS["dataset_len"])
    sampler = GlobalBatchSampler(length, batch, TrainingConfig().seed)
    ledgers = {name: read_ledger(path) for name, path in spec["ledgers"].items()}
    audit_problems = audit(ledgers, steps, sampler)
    if steps * batch > length:
        # a sample seen again in a later epoch is not "consumed twice": check once per epoch
        audit_problems = [p for p in audit_problems if "consumed twice" not in p]
        audit_problems += per_epoch_duplicates(ledgers, steps, batch, length)
    final_problems: list[str] = []
    figures: dict[str, Any] = {"ledger_records": sum(len(v) for v in ledgers.values())}
    finals = {}
    for node, path in spec["finals"].items():
        if not Path(path).exists():
            final_problems.append(f"{node} did not finish training (no {Path(path).name})")
            continue
        finals[node] = torch.load(path, weights_only=True)
    if finals:
        first = next(iter(finals))
        apart = max(max_rel_diff(finals[n], finals[first]) for n in finals)
        figures["replicas_max_rel_diff"] = apart
        # Not required bit-identical: a node that missed the end of the job (stopped or down
        # when its peers finished) retrains the last steps alone in a 1-member group, so its
        # float summation order differs (seen: 6.8e-7). The ledgers hold the exact check.
        if not apart < limit:
            final_problems.append(f"final replicas differ (max relative difference {apart:.2e})")
        if spec.get("reference_final"):
            ref = torch.load(spec["reference_final"], weights_only=True)
            ref_losses = {e["step"]: e["loss"] for e in read_ledger(spec["reference_ledger"])}
            drift = max_rel_diff(finals[first], ref)
            figures["reference_max_rel_diff"] = drift
            if steps <= int(spec["exact_horizon"]):
                if not drift < limit:
                    final_problems.append(f"the final model drifted from the fault-free run by {drift:.2e} "
                                          f"(limit {limit:g})")
            else:
                final_problems += check_trajectory(ledgers, ref_losses, figures, limit)
    return {"audit": audit_problems, "final": final_problems, "figures": figures}


def check_trajectory(ledgers: dict[str, list[dict]], ref_losses: dict[int, float], figures: dict[str, Any],
                     limit: float = MAX_REL_DIFF) -> list[str]:
    """Past the exact horizon the final model cannot match a 1-node run: the gradient's float
    summation order depends on the world size, and this ReLU model's SGD trajectory amplifies
    1e-7 differences to O(1) within a few thousand steps even without any fault (measured). So
    compare the per-step loss with the fault-free run's: find where it first departs by more than
    `limit` (relative), and call it a violation when that step is the first step of a generation
    (right after a re-form or a heal: a faulty heal or redo shows at once) or when the loss
    departs by more than 1e-2 in one step (float-order chaos starts small and grows)."""
    first_of_gen: dict[int, int] = {}
    loss: dict[int, float] = {}
    for records in ledgers.values():
        for e in records:
            first_of_gen[e["gen"]] = min(first_of_gen.get(e["gen"], e["step"]), e["step"])
            loss.setdefault(e["step"], e["loss"])
    starts = set(first_of_gen.values())
    onset = None
    for step in sorted(loss):
        ref = ref_losses.get(step)
        if ref is not None and abs(loss[step] - ref) / max(abs(ref), 1e-12) > limit:
            onset = step
            break
    figures["trajectory_onset_step"] = onset
    if onset is None:
        return []
    gap = abs(loss[onset] - ref_losses[onset]) / max(abs(ref_losses[onset]), 1e-12)
    last_start = max((s for s in starts if s <= onset), default=0)
    figures["trajectory_onset_gap"] = gap
    figures["trajectory_onset_after_reform"] = onset - last_start
    if onset == last_start or gap > 1e-2:
        return [f"the loss departs from the fault-free run at step {onset} by {gap:.1e}, "
                f"{onset - last_start} steps after a re-form (a heal or redo gone wrong?)"]
    return []


def per_epoch_duplicates(ledgers: dict[str, list[dict]], steps: int, batch: int, length: int) -> list[str]:
    """Samples seen twice within one epoch (stream positions [e*length, (e+1)*length))."""
    by_step = {}
    for records in ledgers.values():
        for e in records:
            by_step[e["step"]] = e["indices"]
    seen: dict[int, set[int]] = {}
    twice = 0
    for step in sorted(s for s in by_step if s < steps):
        for j, index in enumerate(by_step[step]):
            epoch = (step * batch + j) // length
            bucket = seen.setdefault(epoch, set())
            twice += index in bucket
            bucket.add(index)
    return [f"{twice} samples consumed twice within an epoch"] if twice else []


def max_rel_diff(a: dict, b: dict) -> float:
    """Largest |a-b| / max|b| over the tensors of two state dicts."""
    return max(float((a[k].float() - b[k].float()).abs().max() / b[k].float().abs().max().clamp_min(1e-12)) for k in a)


def main() -> int:
    """Read the spec from stdin, print the result as one JSON object."""
    print(json.dumps(check(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
