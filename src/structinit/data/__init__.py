"""What a model is fed: data sets and their subsets (datasets.py), batched augmentation (augment.py)."""
