"""The scripts behind the Makefile's targets; the Python ones run with the repository on PYTHONPATH."""
