"""`python -m mmworker`: the `mmworker` command, for environments without the console script on PATH."""

import sys

from mmworker.cli import main

if __name__ == "__main__":
    sys.exit(main())
