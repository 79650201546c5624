"""``python -m engine ...``"""

import sys

try:  # Ctrl-C while the modules load (before the CLI's own handler) is a cancel too
    from engine.cli import main

    code = main()
except KeyboardInterrupt:
    print("cancelled: interrupted", file=sys.stderr)
    code = 130
sys.exit(code)
