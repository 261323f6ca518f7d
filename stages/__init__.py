"""DVC stage entry points, one module per stage: ``python -m stages.<name>``.

Each loads its params section(s), calls pure functions from ``graft``, and writes its outputs atomically.
"""

import graft  # noqa: F401,E402  first: sets the OpenMP wait policy before a stage imports torch (graft.openmp)
