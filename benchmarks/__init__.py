"""Benchmarks of graft (python -m benchmarks); see BENCHMARKS.md. Not part of the installed package."""
