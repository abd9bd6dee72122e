"""`python -m splitserve.bench ...`: the same as `splitserve bench ...`."""

import sys

from splitserve.bench.cli import main

sys.exit(main())
