"""`python -m dpeer.peer.chaos`: the same flags as `dpeer chaos`."""

import sys

from dpeer.peer.chaos.command import main

sys.exit(main())
