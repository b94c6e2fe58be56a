"""``python -m mpt ...``: the ``mpt`` command (:mod:`mpt.cli`)."""
import sys

from mpt.cli import main

sys.exit(main())
