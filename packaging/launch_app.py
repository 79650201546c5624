"""Frozen entry point of the studio (``export-studio``)."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
