"""``python -m bench.native_probe``: see the package's docstring."""

import sys

from bench.native_probe import main

sys.exit(main())
