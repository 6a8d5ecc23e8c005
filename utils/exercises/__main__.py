"""``python -m utils.exercises [NN ...]`` (``make progress``): which exercises pass, per notebook."""

import sys

from utils.exercises.section import progress

if __name__ == "__main__":
    print(progress(sys.argv[1:] or None))
