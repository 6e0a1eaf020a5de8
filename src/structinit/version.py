"""The version of structinit, for the package face, saved inits and run records."""

__version__ = "0.5.0"
# the name on the package index, for `pip install` (`structinit` there is an unrelated project)
DISTRIBUTION = "structinit-vit"
