"""What the node answers: the Peer RPC service, the status document of `dpeer status`, /metrics."""
