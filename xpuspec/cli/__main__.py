"""``python -m xpuspec.cli``: the `xpuspec` command."""

import sys

from xpuspec.cli import main

sys.exit(main())
