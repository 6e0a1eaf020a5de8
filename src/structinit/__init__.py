"""structinit: convolutional inductive bias for Vision Transformers through initialisation alone."""

import os
from typing import TYPE_CHECKING

from .lazy import lazy_names

# torch's OpenMP threads (libgomp) spin 300,000 turns at every barrier before they sleep: beside other work a
# waiting thread burns the CPU its partner needs (the demo beside two busy processes: 8.1x its idle time, 3.3x
# its CPU time); 3,000 turns cost nothing idle and make that 3.4x and 1.1x (docs/bench_contention.md). Read when
# torch loads: set here, before it does; a value the user set stays.
os.environ.setdefault("GOMP_SPINCOUNT", "3000")
from .version import __version__

if TYPE_CHECKING:
    from .experiment import GridResult, RunResult, compare, train
    from .export import load_init, save_init
    from .inits import (
        METHODS,
        FilterOptions,
        ImpulseOptions,
        MimeticOptions,
        MixerImpulseOptions,
        SwinImpulseOptions,
        initialize,
    )
    from .measure import fidelity, measure_on_images
    from .report import Report
    from .training.settings import TrainConfig

# every name, imported when first used: `import structinit` (and the command's --help) loads neither torch's
# models nor timm until a name needs them
LAZY = {
    "load_init": "export",
    "save_init": "export",
    "fidelity": "measure",
    "measure_on_images": "measure",
    "METHODS": "inits",
    "FilterOptions": "inits",
    "ImpulseOptions": "inits",
    "MimeticOptions": "inits",
    "MixerImpulseOptions": "inits",
    "SwinImpulseOptions": "inits",
    "initialize": "inits",
    "Report": "report",
    "train": "experiment",
    "compare": "experiment",
    "RunResult": "experiment",
    "GridResult": "experiment",
    "TrainConfig": "training.settings",
}


__getattr__ = lazy_names(__name__, LAZY)


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])


__all__ = [
    "METHODS",
    "FilterOptions",
    "GridResult",
    "ImpulseOptions",
    "MimeticOptions",
    "MixerImpulseOptions",
    "Report",
    "RunResult",
    "SwinImpulseOptions",
    "TrainConfig",
    "__version__",
    "compare",
    "fidelity",
    "initialize",
    "load_init",
    "measure_on_images",
    "save_init",
    "train",
]
