"""How a run feeds its model (Feed): its batches, its share of them, and the transforms of timm's train.py it was
given (--mean/--std, --hflip, --color-jitter, --crop-pct, --scale/--ratio, --interpolation), each read with timm's
meaning or refused in one line where structinit's pipeline cannot take it."""

from __future__ import annotations

from dataclasses import dataclass

TORCH_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")  # those torch's resize computes
# the flags of timm's transforms that Feed keeps, by its field
TIMM_FLAGS = {
    "mean": "--mean",
    "std": "--std",
    "hflip": "--hflip",
    "color_jitter": "--color-jitter",
    "crop_pct": "--crop-pct",
    "scale": "--scale",
    "ratio": "--ratio",
    "interpolation": "--interpolation",
}


@dataclass
class Feed:
    """How a run feeds its model: the batch of one process (the global batch / `world`), its place among
    the processes, the split it evaluates on and the augmentation of training batches; None: the default
    of each of timm's transforms (see `flip_probability`, `jitter`)."""

    batch: int
    eval_batch: int
    eval_split: str = "test"
    rank: int = 0
    world: int = 1
    crop_padding: int | None = None  # None: image size / 8
    flip: bool | None = None  # None: on, except for digits and svhn
    randaugment: str | None = None
    reprob: float = 0.0
    workers: int = 0
    seed: int = 0
    show: bool = False  # a progress bar over each epoch's steps
    eval_per_class: int | None = None  # evaluate(subset=True): up to this many images a class, drawn once
    aug_repeats: float = 0.0  # timm's RepeatAugSampler under several processes (0: off)
    mean: list[float] | None = None  # None: the model's
    std: list[float] | None = None
    hflip: float | None = None  # the flip's probability (None: 0.5 where `flip` is on)
    color_jitter: float | None = None  # None: timm's 0.4 on streamed images, off in memory
    crop_pct: float | None = None  # None: streamed images the model's; in memory, evaluated as they are
    scale: list[float] | None = None  # None: timm's RandomResizedCrop's (streamed images)
    ratio: list[float] | None = None
    interpolation: str | None = None  # the evaluation resize's (None: the model's; bicubic in memory)
    pin_memory: bool | None = None  # None: on CUDA

    def flip_probability(self, data_name: str) -> float:
        """--hflip, else 0.5 where `flip` is on (by default except for digits and svhn)."""
        if self.hflip is not None:
            return self.hflip
        on = self.flip if self.flip is not None else data_name not in ("digits", "svhn")
        return 0.5 if on else 0.0

    def jitter(self, streamed: bool) -> float:
        """The colour jitter the training images get, by timm's rule: --color-jitter (default 0.4 on streamed
        images, as timm's train.py, 0 in memory), none under an --aa policy unless it has '3a' (timm's
        transforms_imagenet_train turns colour jitter off with an auto-augment policy)."""
        strength = self.color_jitter if self.color_jitter is not None else (0.4 if streamed else 0.0)
        return 0.0 if self.randaugment and "3a" not in self.randaugment else strength

    def check_in_memory(self) -> None:
        """One line for what images held in memory cannot take: timm's RandomResizedCrop (--scale, --ratio), and
        an evaluation resize (--crop-pct) by an interpolation torch does not compute."""
        for name in ("scale", "ratio"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{TIMM_FLAGS[name]}: images held in memory (up to 64 px) train with a padded random crop, not "
                    "timm's RandomResizedCrop; leave it out, or stream the images through timm's transforms "
                    "(an image folder with --img-size over 64)"
                )
        if self.crop_pct is not None and self.interpolation not in (None, *TORCH_INTERPOLATIONS):
            raise ValueError(
                f"--interpolation {self.interpolation}: images held in memory are resized for --crop-pct by torch, "
                f"which computes {', '.join(TORCH_INTERPOLATIONS)}; give one of them"
            )

    def lines(self, streamed: bool, data_name: str) -> list[str]:
        """What the timm flags given became (nothing where none was given), as the run says before it trains."""
        if all(getattr(self, name) is None for name in TIMM_FLAGS):
            return []
        strength, jitter = self.color_jitter, self.jitter(streamed)
        jittered = f"colour jitter {jitter:g}"
        if strength and not jitter:
            jittered = f"--color-jitter {strength:g} off under --aa {self.randaugment} (as in timm: no colour jitter "
            jittered += "with an auto-augment policy unless it has '3a')"
        crop = "timm's RandomResizedCrop" if streamed else "a padded random crop"
        evaluation = "timm's evaluation crop" if streamed else "as they are"
        if self.crop_pct is not None:
            evaluation = f"resized to size / {self.crop_pct:g}, then centre-cropped"
        line = f"transforms: training images {crop}, flip {self.flip_probability(data_name):g}, {jittered}; "
        line += f"evaluation images {evaluation}"
        if self.mean is not None or self.std is not None:
            line += f"; normalised by mean {_shown(self.mean)}, std {_shown(self.std)}"
        return [line]


def _shown(values: list[float] | None) -> str:
    return " ".join(f"{v:g}" for v in values) if values else "(the model's)"


def per_channel(values: list[float] | None, flag: str, channels: int) -> tuple[float, ...] | None:
    """--mean or --std for `channels` channels, as timm's resolve_data_config reads them: one value is every
    channel's, otherwise one a channel (three values on grayscale data are refused: timm's Normalize would fail,
    and averaging them is not the grayscale's statistics)."""
    if values is None:
        return None
    if len(values) == 1:
        return tuple(values) * channels
    if len(values) != channels:
        other = f" or {channels} (one a channel)" if channels > 1 else ""
        raise ValueError(
            f"{flag} {_shown(values)}: the data has {channels} channel(s); give one value (every channel's){other}"
        )
    return tuple(values)
