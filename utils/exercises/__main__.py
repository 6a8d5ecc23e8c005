"""``python -m utils.exercises [NN ...]`` (``make progress``): which exercises pass, per notebook.
Used by no notebook. Lives in utils/ because it is the package's command line, which a learner runs.
"""

import sys

from utils.exercises.section import progress

if __name__ == "__main__":
    print(progress(sys.argv[1:] or None))
