"""The instructor's command: `python -m autograder.grade ...` (the command line is autograder.grading.cli).

    python -m autograder.grade autograde 02_tensor_parallel --jobs 8
    python -m autograder.grade --help          # every subcommand
"""

import sys

from autograder.grading.cli import main

if __name__ == "__main__":
    sys.exit(main())
