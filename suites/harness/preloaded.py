"""A module for ``test_pool``'s preload test: it notes which process imported it."""

from __future__ import annotations

import os

IMPORTED_BY = os.getpid()
