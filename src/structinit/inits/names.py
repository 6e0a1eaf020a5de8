"""The init methods by name, for labels read without loading the model families: the plain ViTs' methods
(registry.METHODS, a test keeps the two equal) and ConvMixer's filter methods (inits/convmixer.py)."""

METHOD_NAMES = ("timm", "kaiming", "mimetic", "impulse", "qk-norm", "select", "conditioned", "sinusoidal", "mimetic-vo")
FILTER_METHODS = ("random", "impulse", "box")
