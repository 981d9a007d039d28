"""A seeded, deterministic discrete-event simulator for the pure protocol cores."""
