"""The gRPC transport: the only place besides generated code that imports grpc.

server.py serves the Peer service and hands requests to a `PeerHandler`; client.py sends
one-way envelopes to peers (reporting refused connections) and makes the operator calls.
"""

import os as _os

# gRPC's C core otherwise prints absl INFO lines (e.g. every failed TLS handshake) on stderr,
# which breaks "logs are one JSON object a line" and the CLI's one-sentence errors. Real
# errors still print; an operator who wants more sets GRPC_VERBOSITY=DEBUG themselves.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
