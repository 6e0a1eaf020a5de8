"""The batches a run trains and evaluates on, from one interface: `InMemoryBatches` augments whole
batches of small images held on the device (fast for 8-96 px data on a CPU or a GPU), `StreamBatches`
reads larger images through DataLoaders with timm's transforms. Each process of a DDP run gets its
share; the same epoch and generator give the same batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from timm.data import Mixup, create_transform, resolve_data_config
from timm.data.random_erasing import RandomErasing
from torch import nn
from tqdm.auto import tqdm

from .augment import BatchAugment, centre_crop
from .datasets import Relabelled, StreamData, TensorData
from .feed import Feed, per_channel
from .imagefolder import ImageError
from .randaugment import keep_zero_bits
from .subsets import stratified_head
from .transfer import to_device

Batch = tuple[torch.Tensor, torch.Tensor]


def dataset_labels(dataset: torch.utils.data.Dataset) -> torch.Tensor:
    """The labels of a streamed dataset, read from its listing where it has one (a subset, a relabelled
    one, an image tree, torchvision's), not by decoding its images."""
    if isinstance(dataset, torch.utils.data.Subset):
        return dataset_labels(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, Relabelled):
        return dataset.relabel[dataset_labels(dataset.dataset)]
    for name in ("targets", "_labels", "labels"):  # image trees, torchvision's sets (a list, array or tensor)
        if getattr(dataset, name, None) is not None:
            return torch.as_tensor(getattr(dataset, name))
    return torch.as_tensor([label for _, label in dataset])


def evaluation_labels(data: TensorData | StreamData, split: str) -> torch.Tensor:
    """The labels of the evaluation split ("val" or "test")."""
    if isinstance(data, TensorData):
        return data.val_labels if split == "val" else data.test_labels
    return dataset_labels(data.val if split == "val" else data.test)


def evaluation_subset(data: TensorData | StreamData, feed: Feed) -> torch.Tensor | None:
    """The indices of the evaluation subset (feed.eval_per_class images a class, the same in every run)."""
    if feed.eval_per_class is None:
        return None
    return stratified_head(evaluation_labels(data, feed.eval_split), feed.eval_per_class, seed=0)


def batches_for(data: TensorData | StreamData, model: nn.Module, feed: Feed, device: torch.device, mixup: Mixup | None):
    """InMemoryBatches for data held in memory, StreamBatches otherwise."""
    kind = InMemoryBatches if isinstance(data, TensorData) else StreamBatches
    return kind(data, model, feed, device, mixup)


class InMemoryBatches:
    """Small images on the device, augmented (crop, flip, RandAugment, mixup/cutmix, erasing) a whole
    batch at a time from the epoch's generator."""

    def __init__(self, data: TensorData, model: nn.Module, feed: Feed, device: torch.device, mixup: Mixup | None):
        feed.check_in_memory()
        self.data, self.feed, self.device = data, feed, device
        self.mean, self.std = normalisation(model, data.image_shape[0], feed)
        padding = feed.crop_padding if feed.crop_padding is not None else data.image_shape[1] // 8
        flip, jitter = feed.flip_probability(data.name), feed.jitter(streamed=False)
        self.augment = BatchAugment(self.mean, self.std, padding, flip, mixup, feed.randaugment, jitter)
        self.images, self.labels = data.train_images.to(device), data.train_labels.to(device)
        self.eraser = RandomErasing(feed.reprob, mode="pixel", device=str(device)) if feed.reprob > 0 else None
        self.steps = len(self.labels) // (feed.batch * feed.world)
        self.subset = evaluation_subset(data, feed)
        self.eval_counts = (len(evaluation_labels(data, feed.eval_split)), _count(self.subset))

    def train(self, epoch: int, generator: torch.Generator) -> Iterator[Batch]:
        """This process's share of every step of `epoch`."""
        feed, steps, whole = self.feed, self.steps, self.feed.batch * self.feed.world
        order = torch.randperm(len(self.labels), generator=generator)[: steps * whole].view(steps, whole)
        order = to_device(order, self.device)  # one copy an epoch, which the host does not wait for
        mine = slice(feed.rank * feed.batch, (feed.rank + 1) * feed.batch)
        for index in _progress(order, epoch, steps, feed.show):
            images, labels = self.augment(self.images[index], self.labels[index], generator)
            images, labels = images[mine], labels[mine]
            yield (self.eraser(images) if self.eraser is not None else images), labels

    def evaluate(self, subset: bool = False) -> Iterator[Batch]:
        """This process's share of the evaluation split (`subset`: of its evaluation subset), normalised."""
        data, feed = self.data, self.feed
        if feed.eval_split == "val":
            images, labels = data.val_images, data.val_labels
        else:
            images, labels = data.test_images, data.test_labels
        normalise = BatchAugment(self.mean, self.std).normalise
        chosen = self.subset if subset and self.subset is not None else torch.arange(len(labels))
        for index in chosen[feed.rank :: feed.world].split(feed.eval_batch):
            batch = images[index].to(self.device)
            if feed.crop_pct is not None:
                batch = centre_crop(batch, feed.crop_pct, feed.interpolation or "bicubic")
            yield normalise(batch), labels[index].to(self.device)

    def lines(self) -> list[str]:
        """What timm's transforms given became (Feed.lines)."""
        return self.feed.lines(streamed=False, data_name=self.data.name)


class StreamBatches:
    """Images read by DataLoader workers through timm's transforms, with a DistributedSampler under DDP."""

    def __init__(self, data: StreamData, model: nn.Module, feed: Feed, device: torch.device, mixup: Mixup | None):
        self.feed, self.device, self.mixup, self.name = feed, device, mixup, data.name
        self.train_loader, self.eval_loader, self.subset_loader = _loaders(data, model, feed)
        subset = self.subset_loader.dataset if self.subset_loader is not None else None
        self.eval_counts = (len(self.eval_loader.dataset), _count(subset))
        self.steps = len(self.train_loader)  # the sampler's share, in whole batches (timm's RepeatAugSampler: its own)

    def train(self, epoch: int, generator: torch.Generator) -> Iterator[Batch]:
        if self.feed.world > 1:
            self.train_loader.sampler.set_epoch(epoch)
        for item in _progress(_named_images(self.train_loader), epoch, self.steps, self.feed.show):
            images, labels = (t.to(self.device, non_blocking=True) for t in item)
            yield self.mixup(images, labels) if self.mixup is not None else (images, labels)

    def evaluate(self, subset: bool = False) -> Iterator[Batch]:
        loader = self.subset_loader if subset and self.subset_loader is not None else self.eval_loader
        for images, labels in _named_images(loader):
            yield images.to(self.device), labels.to(self.device)

    def lines(self) -> list[str]:
        return self.feed.lines(streamed=True, data_name=self.name)


def _count(items) -> int | None:
    return len(items) if items is not None else None


def _progress(items, epoch: int, steps: int, show: bool):
    return tqdm(items, desc=f"epoch {epoch + 1}", leave=False, disable=not show or None, total=steps)


def normalisation(model: nn.Module, channels: int, feed: Feed | None = None) -> tuple[tuple[float, ...], ...]:
    """The mean and std of each channel: the feed's --mean and --std, else those the model's pretrained config
    names (0.5 for each channel otherwise)."""
    config = getattr(model, "pretrained_cfg", {}) or {}
    mean, std = config.get("mean", (0.5,) * 3), config.get("std", (0.5,) * 3)
    if channels != len(mean):
        mean, std = (0.5,) * channels, (0.5,) * channels
    if feed is not None:
        mean = per_channel(feed.mean, "--mean", channels) or mean
        std = per_channel(feed.std, "--std", channels) or std
    return tuple(mean), tuple(std)


def normalise_for(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, C, H, W) as `model` sees them at evaluation."""
    mean, std = normalisation(model, images.shape[1])
    return BatchAugment(mean, std).normalise(images)


def normalised_test_images(model: nn.Module, data: TensorData | StreamData, count: int) -> torch.Tensor:
    """The first `count` test images, as the model sees them at evaluation."""
    return normalised_images(model, data, count, "test")


def normalised_images(model: nn.Module, data: TensorData | StreamData, count: int, split: str) -> torch.Tensor:
    """The first `count` images of `split` ("train" or "test"), as the model sees them at evaluation."""
    if isinstance(data, TensorData):
        return normalise_for(model, getattr(data, f"{split}_images")[:count])
    transform = create_transform(**_data_config(model), is_training=False)
    dataset = getattr(data, split)
    return torch.stack([transform(dataset[i][0]) for i in range(min(count, len(dataset)))])


def _loaders(data: StreamData, model: nn.Module, feed: Feed):
    """DataLoaders with timm's transforms (and a DistributedSampler under DDP) for large images."""
    data_config = _data_config(model)
    for name in ("mean", "std"):  # --mean/--std given, else timm's config of the model as before
        data_config[name] = per_channel(getattr(feed, name), f"--{name}", data.channels) or data_config[name]
    train_tf = keep_zero_bits(
        create_transform(
            **data_config,
            is_training=True,
            auto_augment=feed.randaugment,
            re_prob=feed.reprob,
            hflip=feed.flip_probability(data.name),
            color_jitter=feed.jitter(streamed=True) or None,
            scale=feed.scale,
            ratio=feed.ratio,
        )
    )
    evaluated = {**data_config, **{k: getattr(feed, k) for k in ("crop_pct", "interpolation") if getattr(feed, k)}}
    test_tf = create_transform(**evaluated, is_training=False)
    train_set = _Transformed(data.train, train_tf)
    test_set = _Transformed(data.val if feed.eval_split == "val" else data.test, test_tf)
    if feed.world > 1 and feed.aug_repeats:
        from timm.data.distributed_sampler import RepeatAugSampler

        sampler = RepeatAugSampler(train_set, feed.world, feed.rank, shuffle=True, num_repeats=feed.aug_repeats)
        test_sampler = torch.utils.data.DistributedSampler(test_set, feed.world, feed.rank, shuffle=False)
    elif feed.world > 1:
        sampler = torch.utils.data.DistributedSampler(
            train_set, feed.world, feed.rank, shuffle=True, seed=feed.seed, drop_last=True
        )
        test_sampler = torch.utils.data.DistributedSampler(test_set, feed.world, feed.rank, shuffle=False)
    else:
        sampler, test_sampler = torch.utils.data.RandomSampler(train_set), None
    common: dict[str, Any] = dict(
        num_workers=feed.workers,
        pin_memory=feed.pin_memory if feed.pin_memory is not None else torch.cuda.is_available(),
        persistent_workers=feed.workers > 0,
    )
    train_loader = torch.utils.data.DataLoader(train_set, feed.batch, sampler=sampler, drop_last=True, **common)
    test_loader = torch.utils.data.DataLoader(test_set, feed.eval_batch, sampler=test_sampler, **common)
    subset = evaluation_subset(data, feed)
    if subset is None:
        return train_loader, test_loader, None
    subset_set = torch.utils.data.Subset(test_set, subset.tolist())
    subset_sampler = (
        torch.utils.data.DistributedSampler(subset_set, feed.world, feed.rank, shuffle=False)
        if feed.world > 1
        else None
    )
    subset_loader = torch.utils.data.DataLoader(subset_set, feed.eval_batch, sampler=subset_sampler, **common)
    return train_loader, test_loader, subset_loader


def _data_config(model: nn.Module) -> dict[str, Any]:
    """timm's data config of the model, with the input size the model was built for."""
    config = resolve_data_config({}, model=model)
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is not None:
        config["input_size"] = (config["input_size"][0], *size)
    return config


def _named_images(loader: torch.utils.data.DataLoader):
    """The loader's batches; an image a worker cannot decode ends the run in one line naming it."""
    try:
        yield from loader
    except ImageError as error:
        raise ImageError.from_worker(error) from None


class _Transformed(torch.utils.data.Dataset):
    def __init__(self, dataset, transform) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        image, label = self.dataset[index]
        return self.transform(image), label
