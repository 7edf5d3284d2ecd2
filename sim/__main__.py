"""``python -m sim``: replay a trace against an app's variants (``sim.cli``)."""

import sys

from sim.cli import main

sys.exit(main())
