"""The daemon <-> worker channel: files in the data dir (views, reports, checkpoints); no torch, no grpc."""
