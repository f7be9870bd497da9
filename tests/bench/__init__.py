"""Benchmarks on the real local control plane (``python -m tests.bench``, ``tox -e bench``).

Never collected by pytest (no ``test_`` modules here); see docs/benchmarks.md.
"""
