"""`python -m dpeer.chaos`: the same flags as `dpeer chaos`."""

import sys

from dpeer.chaos.command import main

sys.exit(main())
