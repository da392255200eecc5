"""``python -m ci.gate``: see :mod:`ci.gate.cli`."""

import sys

from ci.gate import process
from ci.gate.cli import main

process.terminate_on_sigterm()  # the entry point only: main() also runs inside test processes
sys.exit(main())
