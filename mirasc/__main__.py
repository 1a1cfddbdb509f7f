"""`python -m mirasc ...`: the `mirasc` command (docs/cli.md)."""

import sys

from .cli import main

sys.exit(main())
