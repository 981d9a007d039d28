#!/usr/bin/env python3
"""Seeded chaos run of a local dpeer cluster, then the checks: a thin wrapper of `dpeer chaos`.

Example (the long run of BENCHMARKS.md "Chaos"):
    python scripts/chaos.py --nodes 5 --duration 600 --fault-every 14 --steps 8000 --seed 7 --out chaos-out
The logic lives in dpeer/chaos/; `python scripts/chaos.py --help` lists the flags.
"""

import sys

from dpeer.chaos import main

if __name__ == "__main__":
    sys.exit(main())
