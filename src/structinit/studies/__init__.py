"""Grids of runs and what is made of them: grid.py (compare, results, ledgers), plots.py, launch.py."""
