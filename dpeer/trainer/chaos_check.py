"""Training-side checks of a `dpeer chaos` run (dpeer/chaos/), run as a child process:
``python -m dpeer.trainer.chaos_check`` reads a JSON spec on stdin and prints a JSON result.

It lives in the trainer layer because it reads ledgers and torch state dicts; the chaos driver in
dpeer/chaos stays free of torch and of trainer imports (tests/test_layers.py), as the worker
supervisor does with ``python -m dpeer.trainer.worker``.

spec: {"ledgers": {NAME: PATH}, "finals": {NODE: PATH}, "steps", "global_batch", "micro_batch", "seed",
       "reduction": "exact"|"fast", "reference_final": PATH|null, "reference_skipped": REASON|null,
       "max_rel_diff"}
result: {"checks": {NAME: {"problems": [...], "note": WHAT WAS COMPARED, "ran": bool}}, "figures": {...}}

With exact reduction the final models must be equal bit for bit (state-dict digests), to each other
and to the fault-free reference, for the whole run; with fast reduction, float32 sums change with
the world size, so they are compared to ``max_rel_diff`` and the figure says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

MAX_REL_DIFF = 1e-4
AUDIT = "ledger audit: every committed step, each micro-batch trained once by the group that committed it"
REPLICAS = "replicas agree (digests at equal steps)"
FINISHED = "training finished on every node"
FINAL_REPLICAS = "final replicas equal"
REFERENCE = "final model = fault-free run"


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Audit the ledgers, compare the final models with each other and with the reference."""
    import torch

    from dpeer.trainer.audit import audit_run, read_records
    from dpeer.trainer.demo import DEFAULTS
    from dpeer.trainer.sampler import GlobalBatchSampler

    exact = spec["reduction"] == "exact"
    steps, batch, length = int(spec["steps"]), int(spec["global_batch"]), int(DEFAULTS["dataset_len"])
    sampler = GlobalBatchSampler(length, batch, int(spec.get("seed", DEFAULTS["seed"])))
    ledgers = {name: read_records(path) for name, path in spec["ledgers"].items()}
    result = audit_run(ledgers, steps, sampler, int(spec["micro_batch"]) if exact else None)
    checks = {
        AUDIT: row([p for p in result.problems if p not in result.disagreements], result.trained_summary(exact)),
        REPLICAS: row(result.disagreements, result.digest_summary(exact)),
    }
    figures: dict[str, Any] = {"ledger_records": sum(len(v) for v in ledgers.values())}
    finals = {n: torch.load(p, weights_only=True) for n, p in spec["finals"].items() if Path(p).exists()}
    unfinished = [f"{n} did not finish training (no {Path(p).name})" for n, p in spec["finals"].items() if n not in finals]
    checks[FINISHED] = row(unfinished, f"{len(finals)} of {len(spec['finals'])} nodes saved a final model")
    checks.update(compare_finals(finals, spec, exact, figures, torch))
    return {"checks": checks, "figures": figures}


def row(problems: list[str], note: str, ran: bool = True) -> dict[str, Any]:
    """One check's outcome: its violations, what it compared, whether it ran."""
    return {"problems": problems, "note": note, "ran": ran}


def compare_finals(finals: dict[str, dict], spec: dict[str, Any], exact: bool, figures: dict[str, Any],
                   torch: Any) -> dict[str, dict[str, Any]]:
    """The final replicas against each other and the first against the fault-free reference."""
    limit = float(spec.get("max_rel_diff", MAX_REL_DIFF))
    if not finals:
        return {FINAL_REPLICAS: row([], "not run: no node saved a final model", ran=False),
                REFERENCE: row([], "not run: no node saved a final model", ran=False)}
    first = next(iter(finals))
    digests = {n: state_digest(sd) for n, sd in finals.items()}
    apart = max(max_rel_diff(finals[n], finals[first]) for n in finals)
    figures.update(final_digests=digests, replicas_max_rel_diff=apart)
    out = {FINAL_REPLICAS: _compare("final replicas", digests, apart, exact, limit)}
    if spec.get("reference_final") is None:
        out[REFERENCE] = row([], spec.get("reference_skipped") or "not run", ran=False)
        return out
    ref = torch.load(spec["reference_final"], weights_only=True)
    drift = max_rel_diff(finals[first], ref)
    figures.update(reference_digest=state_digest(ref), reference_max_rel_diff=drift)
    out[REFERENCE] = _compare(f"{first}'s final model and the 1-node fault-free run's",
                              {first: digests[first], "reference": state_digest(ref)}, drift, exact, limit)
    return out


def _compare(what: str, digests: dict[str, str], diff: float, exact: bool, limit: float) -> dict[str, Any]:
    """Exact: digests equal, else a violation with the difference. Fast: within `limit`, said so."""
    equal = len(set(digests.values())) == 1
    if exact:
        if equal:
            return row([], f"state-dict digest equal ({next(iter(digests.values()))[:16]}) over {len(digests)} models")
        shown = ", ".join(f"{n} {d[:12]}" for n, d in digests.items())
        return row([f"{what} differ: digests {shown}, max relative difference {diff:.2e}"],
                   f"state-dict digests differ, max relative difference {diff:.2e}")
    note = (f"max relative difference {diff:.2e} (fast reduction: float32 sums differ with the world size, "
            f"limit {limit:g}){'; digests equal' if equal else ''}")
    return row([] if diff < limit else [f"{what} differ by {diff:.2e} (limit {limit:g})"], note)


def state_digest(state: dict) -> str:
    """sha256 over a state dict's keys and tensors' dtypes, shapes and bytes, in order."""
    from dpeer.trainer.state import tensor_bytes  # torch: only where state dicts are compared

    h = hashlib.sha256()
    for key, t in state.items():
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def max_rel_diff(a: dict, b: dict) -> float:
    """Largest |a-b| / max|b| over the tensors of two state dicts."""
    return max((float((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp_min(1e-12))
                for k in a if a[k].numel()), default=0.0)


def main() -> int:
    """Read the spec from stdin, print the result as one JSON object."""
    print(json.dumps(check(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
