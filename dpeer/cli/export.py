"""`dpeer export`: the model of a dpeer checkpoint as a file other tools load (trainer/portable.py
does the work; torch loads only when this command runs)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from dpeer.cli.output import error_line
from dpeer.cli.parser import UsageError


def cmd_export(args: argparse.Namespace) -> int:
    """Write SOURCE's model (a data dir's newest checkpoint that verifies, or a checkpoint file) to
    --out and print what was written: step, tensors, bytes and sha256; the newer checkpoints
    skipped because they did not verify are warned about on stderr (listed under --json)."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch's, at import: dpeer needs none
    from dpeer.trainer.portable import export_model

    try:
        done = export_model(args.source, args.out, args.format, args.force)
    except FileExistsError:
        raise UsageError(f"--out {args.out} exists; add --force to replace it, or choose another name") from None
    doc = {
        "out": str(done.out), "format": done.format, "step": done.step, "checkpoint": str(done.source.path),
        "checkpoint_sha256": done.source.sha256, "tensors": done.tensors, "bytes": done.size,
        "sha256": done.sha256, "skipped": list(done.source.skipped),
    }
    if args.json:
        print(json.dumps(doc, sort_keys=True))
        return 0
    for reason in done.source.skipped:
        print(error_line(f"skipped {reason}", 0, False), file=sys.stderr)
    digest = f", sha256 {done.sha256}" if done.sha256 else ""
    print(f"wrote {done.out} ({done.format}): step {done.step} from {done.source.path}, "
          f"{done.tensors} tensors, {done.size} bytes{digest}")
    return 0
