"""``python -m polymixer`` = the ``polymixer`` command (what ``torchrun -m polymixer …`` runs on every rank)."""

import sys

from .experiments.cli import main

sys.exit(main())
