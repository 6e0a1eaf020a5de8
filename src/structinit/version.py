"""The version of structinit, for the package face, saved inits and run records."""

__version__ = "0.2.0"
