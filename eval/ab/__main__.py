"""``python -m eval.ab``: run the A/B harness (eval/ab/cli.py)."""

import sys

from eval.ab.cli import main

sys.exit(main())
