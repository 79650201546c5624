"""Frozen entry point of the engine CLI (``export-studio-engine``)."""

import multiprocessing
import sys

from engine.cli import main

if __name__ == "__main__":
    # bench runs each setting in a spawned child (engine.child): in a frozen program the
    # child is this executable again, and only freeze_support() makes it the child.
    multiprocessing.freeze_support()
    sys.exit(main())
