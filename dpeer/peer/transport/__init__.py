"""The gRPC transport: the only place besides generated code that imports grpc.

server.py serves the Peer service and hands requests to a `PeerHandler`; client.py sends
one-way envelopes to peers (reporting refused connections) and makes the operator calls.
"""
