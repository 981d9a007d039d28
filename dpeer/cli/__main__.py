"""`python -m dpeer.cli`: the `dpeer` command."""

from dpeer.cli.main import main

raise SystemExit(main())
