"""One model, looked at: its attention maps (attention.py) and feature ranks (rank.py), from a run
directory or a model name (target.py)."""
