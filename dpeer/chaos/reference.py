"""The fault-free reference: a 1-node run of the same training config, cached by that config."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dpeer.launch.cluster import LocalCluster

if TYPE_CHECKING:
    from dpeer.chaos.run import Run


def reference_final(run: Run) -> Path:
    """The final model of a 1-node, fault-free run of the same config (cached by config)."""
    key = hashlib.sha256(json.dumps(run.config, sort_keys=True).encode()).hexdigest()[:16]
    cache = run.opts.reference_cache
    if cache is not None and (cache / f"reference-{key}.pt").exists():
        run.say(f"reference model from the cache {cache / f'reference-{key}.pt'}")
        return cache / f"reference-{key}.pt"
    run.say("running the fault-free reference (1 node, same config)")
    done = _train_reference(run)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copy(done, cache / f"reference-{key}.pt")
    return done


def _train_reference(run: Run) -> Path:
    """Train the config on one node until its final model exists (or finish_timeout)."""
    ref = LocalCluster(run.root / "reference", 1, job="demo", config=run.config)
    done = ref.nodes[0].data_dir / "worker" / "final.pt"
    try:
        ref.start_all()
        deadline = time.monotonic() + run.opts.finish_timeout
        while not done.exists() and time.monotonic() < deadline and ref.nodes[0].running:
            time.sleep(0.5)
        time.sleep(0.5)  # torch.save is not atomic: let the worker finish writing and exit
    finally:
        ref.stop_all()
    return done
