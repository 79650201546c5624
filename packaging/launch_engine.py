"""Frozen entry point of the engine CLI (``export-studio-engine``)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
