"""Starting local clusters of daemons as processes (the demo, the chaos tool, tests and benchmarks)."""
