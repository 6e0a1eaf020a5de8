"""One model, looked at: its attention maps (attention.py), feature ranks (rank.py) and Q/K scale
(scale.py), from a run directory or a model name (target.py)."""
