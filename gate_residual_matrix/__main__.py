"""``python -m gate_residual_matrix ...``: the matrix runner's command line."""

import sys

from gate_residual_matrix.runner.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
