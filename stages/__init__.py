"""DVC stage entry points, one module per stage: ``python -m stages.<name>``.

Each loads its params section(s), calls pure functions from ``graft``, and writes its outputs atomically.
"""
