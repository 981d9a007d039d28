"""One node's runtime: membership, agreement on views, the gRPC service, the daemon."""
