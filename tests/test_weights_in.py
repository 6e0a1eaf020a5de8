"""Weights checked the same wherever they enter (issue 67, rule 3), and memory a request implies estimated
before it is allocated (rule 4): --initial-checkpoint, load_init, a teacher and a resumed last.pt refuse
non-float, sparse, quantized, meta, non-finite and huge tensors in one line; timm's checkpoints load; a
file or a model larger than the memory left is one line with the number."""

import argparse
import json
import os
import re
import warnings

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import structinit
from structinit import memory
from structinit.cli import main
from structinit.errors import RunError
from structinit.export import load_weights
from structinit.inits.teacher import load_teacher
from structinit.training.checkpoint import load_checkpoint

TINY = dict(img_size=8, patch_size=2, embed_dim=16, depth=1, num_heads=2, num_classes=10, in_chans=1)
TRAIN = ["train", "--data", "digits", "--per-class", "5", "-b", "25", "--quiet", "--epochs", "1"]
TRAIN += ["--warmup-epochs", "0", "--model-kwargs", "patch_size=2,embed_dim=16,depth=1,num_heads=2,mlp_ratio=4"]


def tiny():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", **TINY)


def qkv(state):
    return next(name for name in state if name.endswith("qkv.weight"))


def quantized(tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.14 deprecates quantized tensors; files of them still exist
        return torch.quantize_per_tensor(tensor, 0.1, 0, torch.qint8)


TAMPERED = {
    "nan": (lambda t: t.fill_(float("nan")), "holds values that are not finite"),
    "inf": (lambda t: t.fill_(float("-inf")), "holds values that are not finite"),
    "huge": (lambda t: t.fill_(1e30), r"holds 1e\+30 \(beyond \+-1e\+06\)"),
    "int64": (lambda t: t.long(), "is torch.int64 where the model's is torch.float32"),
    "bool": (lambda t: t > 0, "is torch.bool where the model's is torch.float32"),
    "complex": (lambda t: t.to(torch.complex64), r"is complex \(torch.complex64\)"),
    "sparse": (lambda t: t.to_sparse(), r"is a sparse tensor \(torch.sparse_coo\).*t.to_dense\(\)"),
    "qint8": (lambda t: quantized(t), r"is quantized \(torch.qint8\)"),
    "meta": (lambda t: t.to("meta"), "is on the meta device"),
}


def tampered(path, how):
    state = {name: t.clone() for name, t in tiny().state_dict().items()}
    change, _ = TAMPERED[how]
    state[qkv(state)] = change(state[qkv(state)])
    torch.save(state, path)
    return path


@pytest.mark.parametrize("how", TAMPERED)
def test_initial_checkpoint_weights_that_are_no_weights_are_refused_and_the_model_is_unchanged(tmp_path, how):
    model = tiny()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with pytest.raises(ValueError, match=TAMPERED[how][1]):
        load_weights(model, tampered(tmp_path / "w.pt", how))
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())


@pytest.mark.parametrize("how", ["nan", "complex", "sparse"])
def test_a_teacher_is_checked_by_the_same_rule(tmp_path, how):
    with pytest.raises(ValueError, match=f"teacher .*w.pt: blocks.0.attn.qkv.weight .*{TAMPERED[how][1]}"):
        load_teacher(tampered(tmp_path / "w.pt", how))


def test_train_refuses_non_finite_initial_weights_in_one_line_leaving_no_run(tmp_path, capsys):
    path = tampered(tmp_path / "w.pt", "huge")
    assert main([*TRAIN, "--initial-checkpoint", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "beyond +-1e+06" in err[0] and not (tmp_path / "run").exists()


def test_a_saved_init_changed_after_saving_is_refused_by_initial_checkpoint(tmp_path):
    model = tiny()
    path = tmp_path / "init.safetensors"
    structinit.save_init(model, path, model_kwargs=TINY)
    with safe_open(str(path), "pt") as file:
        record = file.metadata()
    state = load_file(str(path))
    state[qkv(state)].zero_()
    save_file(state, str(path), metadata=record)
    with pytest.raises(ValueError, match="its weights are not those it was saved with"):
        load_weights(tiny(), path)
    with pytest.raises(ValueError, match="its weights are not those it was saved with"):
        structinit.load_init(path)


def test_a_record_without_its_digest_is_refused(tmp_path):
    path = tmp_path / "init.safetensors"
    structinit.save_init(tiny(), path, model_kwargs=TINY)
    with safe_open(str(path), "pt") as file:
        record = {k: v for k, v in file.metadata().items() if k != "weights_sha256"}
    save_file(load_file(str(path)), str(path), metadata=record)
    for load in (structinit.load_init, lambda p: load_weights(tiny(), p)):
        with pytest.raises(ValueError, match="its record lacks the weights' sha256 that save_init writes"):
            load(path)


def test_a_model_load_init_built_saves_again_to_the_same_weights(tmp_path):
    digest = structinit.save_init(tiny(), tmp_path / "a.safetensors", model_kwargs=TINY)
    model, _ = structinit.load_init(tmp_path / "a.safetensors")
    assert structinit.save_init(model, tmp_path / "b.safetensors") == digest
    _, record = structinit.load_init(tmp_path / "b.safetensors")
    assert record["weights_sha256"] == digest and record["model_kwargs"]["embed_dim"] == 16


def timm_checkpoints(folder):
    """checkpoint-3.pth.tar and model_best.pth.tar as timm's train.py writes them (its args a Namespace)."""
    from timm.utils import CheckpointSaver

    model = tiny()
    args = argparse.Namespace(model="vit_tiny_patch16_224", lr=0.1)
    optimizer = torch.optim.AdamW(model.parameters())
    saver = CheckpointSaver(model, optimizer, args=args, checkpoint_dir=str(folder), recovery_dir=str(folder))
    saver.save_checkpoint(epoch=3, metric=50.0)
    return model


@pytest.mark.parametrize("name", ["checkpoint-3.pth.tar", "model_best.pth.tar"])
def test_timms_own_checkpoints_load(tmp_path, name):
    saved = timm_checkpoints(tmp_path)
    model = tiny()
    torch.nn.init.zeros_(model.head.weight)
    load_weights(model, tmp_path / name)
    assert torch.equal(model.head.weight, saved.head.weight)


@pytest.mark.parametrize("name", ["w.PT", "w.bin", "w.Pth"])
def test_weights_suffixes_in_any_case_and_bin_load(tmp_path, name):
    torch.save(tiny().state_dict(), tmp_path / name)
    load_weights(tiny(), tmp_path / name)


def test_the_help_lists_every_suffix_initial_checkpoint_takes(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(suffix in help_text for suffix in (".safetensors", ".pth", ".pt", ".bin", ".pth.tar"))


def test_a_resumed_run_needs_not_its_initial_file_and_its_tampered_last_pt_is_refused(tmp_path, capsys):
    start = tmp_path / "start.pt"
    torch.save(tiny().state_dict(), start)
    run = tmp_path / "run"
    assert main([*TRAIN, "--initial-checkpoint", str(start), "--out", str(run)]) == 0
    start.unlink()
    assert main(["train", "--resume", "--out", str(run), "--epochs", "2", "--quiet"]) == 0
    assert load_checkpoint(run / "last.pt")["epoch"] == 2
    checkpoint = load_checkpoint(run / "last.pt")
    checkpoint["model"][qkv(checkpoint["model"])].fill_(float("nan"))
    torch.save(checkpoint, run / "last.pt")
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"]) == 2
    assert "last.pt: blocks.0.attn.qkv.weight holds values that are not finite" in capsys.readouterr().err


def sparse_safetensors(path, gigabytes):
    """A .safetensors file declaring one float tensor of `gigabytes`, its data a hole (no disk used)."""
    count = gigabytes * 10**9 // 4
    entry = {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}
    header = json.dumps({"__metadata__": {"format": "pt"}, "big": entry}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + count * 4)
    return path


def test_a_file_larger_than_the_memory_left_is_refused_from_its_header(tmp_path, monkeypatch):
    path = sparse_safetensors(tmp_path / "big.safetensors", 5)
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * 10**9)
    with pytest.raises(
        RunError, match=r"reading big.safetensors needs 5.0 GB of memory, and this process can have 2.0 GB"
    ):
        load_teacher(path)
    with pytest.raises(ValueError, match=r"does not fit the model \(.*1 unexpected: big\)"):
        load_weights(tiny(), path)  # the header says so before a byte of weights is read


def test_a_model_larger_than_the_memory_left_is_one_line_before_it_is_allocated(monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * 10**9)
    assert main(["init", "vit_tiny_patch16_224", "--num-classes", "100000000", "--init", "timm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "vit_tiny_patch16_224 (100,000,000 classes) and its timm init needs 77.2 GB of memory" in err[0]


def test_the_memory_left_counts_an_address_space_limit():
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    room = memory.available_bytes()
    assert room is not None and room > 0
    if hard == resource.RLIM_INFINITY or hard > 10**15:
        pid = os.fork()
        if pid == 0:  # a child under a limit just above what it maps now
            used = memory._status("VmSize")
            resource.setrlimit(resource.RLIMIT_AS, (used + 10**9, hard))
            os._exit(0 if 0.5e9 < memory.available_bytes() <= 1e9 else 1)
        assert os.waitpid(pid, 0)[1] == 0


def test_out_of_memory_nothing_foresaw_is_one_line(monkeypatch, capsys):
    from structinit.cli import commands

    def exhausted(args):
        raise MemoryError

    monkeypatch.setitem(commands.COMMANDS, "init", exhausted)
    assert main(["init", "vit_digits"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["structinit init: error: out of memory: ask for less (a smaller model, batch or image size)"]


def test_float8_weights_are_checked_in_float32_and_load(tmp_path):
    state = {name: t.clone() for name, t in tiny().state_dict().items()}
    state[qkv(state)] = state[qkv(state)].to(torch.float8_e4m3fn)
    torch.save(state, tmp_path / "f8.pt")
    load_weights(tiny(), tmp_path / "f8.pt")
    state[qkv(state)] = torch.full(state[qkv(state)].shape, float("nan")).to(torch.float8_e4m3fn)
    torch.save(state, tmp_path / "f8nan.pt")
    with pytest.raises(ValueError, match="holds values that are not finite"):
        load_weights(tiny(), tmp_path / "f8nan.pt")


# issue 75: one reading of names for every format; headers checked before anything is allocated; values
# named as the file holds them


def saved(state, path):
    """`state` written as `path` says: .safetensors, a bare .pt, or a checkpoint (.pth.tar) holding it."""
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"epoch": 3, "state_dict": state} if path.name.endswith(".pth.tar") else state, path)
    return path


FORMATS = ["w.safetensors", "w.pt", "checkpoint-3.pth.tar"]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "_orig_mod.module."])
def test_a_wrappers_prefix_is_read_alike_in_every_format(tmp_path, name, prefix):
    weights = tiny().state_dict()
    model = tiny()
    torch.nn.init.zeros_(model.head.weight)
    load_weights(model, saved({prefix + key: t.clone() for key, t in weights.items()}, tmp_path / name))
    assert all(torch.equal(model.state_dict()[key], t) for key, t in weights.items())


@pytest.mark.parametrize("name", FORMATS)
def test_a_tensor_and_its_prefixed_twin_are_refused_naming_both(tmp_path, name):
    state = {key: t.clone() for key, t in tiny().state_dict().items()}
    state["module.head.weight"] = torch.ones_like(state["head.weight"])  # the twin once won in .pt files
    model = tiny()
    before = model.head.weight.clone()
    with pytest.raises(ValueError, match=r"holds both head.weight and module.head.weight: one tensor twice"):
        load_weights(model, saved(state, tmp_path / name))
    assert torch.equal(model.head.weight, before)


@pytest.mark.parametrize("name", FORMATS)
def test_another_wrappers_prefix_is_named_in_every_format(tmp_path, name):
    state = {"model." + key: t for key, t in tiny().state_dict().items()}  # Lightning's module holding the model
    with pytest.raises(ValueError, match=r"its names carry the prefix 'model\.' before the model's: save the wrapped"):
        load_weights(tiny(), saved(state, tmp_path / name))


def crafted(path, change):
    """A saved init whose header's head.weight entry `change` rewrites (the bytes after it as they were)."""
    structinit.save_init(tiny(), path, model_kwargs=TINY)
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    change(header["head.weight"])
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length :])
    return path


CRAFTED = {
    "overflowing": (lambda e: e.update(shape=[2**62, 2**62]), r"head.weight's shape \[4611686018427387904, "),
    "too long": (lambda e: e.update(shape=[10, 32]), r"head.weight's shape \[10, 32\] of F32 is not the 640 bytes"),
    "negative": (lambda e: e.update(shape=[-10, -16]), r"head.weight has the shape \[-10, -16\]"),
    "boolean": (lambda e: e.update(shape=[True, 16]), r"head.weight has the shape \[True, 16\]"),
    "beyond the file": (
        lambda e: e.update(data_offsets=[o + 10**12 for o in e["data_offsets"]]),
        r"head.weight's data_offsets \[1000000\d+, 1000000\d+\] lie beyond the file's [\d,]+ bytes of data",
    ),
    "reversed": (lambda e: e["data_offsets"].reverse(), r"head.weight has the shape \[10, 16\] and data_offsets"),
    "shifted": (lambda e: e["data_offsets"].__setitem__(0, e["data_offsets"][0] + 4), "head.weight's shape"),
    "overlapping": (lambda e: e.update(data_offsets=[0, 640]), r"\S+'s data starts at byte 0 of the data, not at"),
}


@pytest.mark.parametrize("how", CRAFTED)
def test_an_impossible_safetensors_header_is_refused_naming_the_file_before_allocating(tmp_path, monkeypatch, how):
    path = crafted(tmp_path / "init.safetensors", CRAFTED[how][0])
    monkeypatch.setattr("safetensors.torch.load_file", lambda *args: pytest.fail("weights read"))
    for load in (structinit.load_init, lambda p: load_weights(tiny(), p)):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: {CRAFTED[how][1]}"):
            load(path)


def test_train_refuses_an_overflowing_header_in_one_line_leaving_no_run(tmp_path, capsys):
    path = crafted(tmp_path / "init.safetensors", CRAFTED["overflowing"][0])
    assert main([*TRAIN, "--initial-checkpoint", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: head.weight's shape [4611686018427387904, " in err[0]
    assert not (tmp_path / "run").exists()


def with_qkv(value, dtype):
    state = {name: t.clone() for name, t in tiny().state_dict().items()}
    state[qkv(state)] = state[qkv(state)].to(dtype)
    state[qkv(state)][0, :3] = value
    return state


@pytest.mark.parametrize("name", ["w.safetensors", "w.pt"])
@pytest.mark.parametrize(
    "value, dtype, said",
    [
        (float("inf"), torch.float16, r"values that are not finite \(3 inf of its 768 torch.float16 values\)"),
        (float("-inf"), torch.bfloat16, r"values that are not finite \(3 -inf of its 768 torch.bfloat16 values\)"),
        (float("nan"), torch.float32, r"values that are not finite \(3 NaN of its 768 torch.float32 values\)"),
        (torch.finfo(torch.bfloat16).max, torch.bfloat16, r"3.39e\+38 \(beyond \+-1e\+06, torch.bfloat16's largest"),
        (2e38, torch.float64, r"2e\+38 \(beyond \+-1e\+06\)"),
    ],
)
def test_values_beyond_the_rule_are_named_as_the_file_holds_them(tmp_path, name, value, dtype, said):
    path = saved(with_qkv(value, dtype), tmp_path / name)
    with pytest.raises(ValueError, match=rf"{path.name}: blocks.0.attn.qkv.weight holds {said}"):
        load_weights(tiny(), path)


@pytest.mark.parametrize("name", ["w.safetensors", "w.pt"])
def test_odd_dtypes_read_alike_in_every_format(tmp_path, name):
    with pytest.raises(ValueError, match=r"qkv.weight is complex \(torch.complex64\): not weights to train from"):
        load_weights(tiny(), saved(with_qkv(0, torch.complex64), tmp_path / f"c{name}"))
    load_weights(tiny(), saved(with_qkv(0.5, torch.float8_e4m3fn), tmp_path / f"f8{name}"))  # .pt's float8 loads


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_a_teacher_whose_weights_are_not_floating_is_refused(tmp_path, dtype):
    path = saved(with_qkv(1, dtype), tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=rf"w.safetensors: blocks.0.attn.qkv.weight is {dtype}, where a layer's"):
        load_teacher(path)
