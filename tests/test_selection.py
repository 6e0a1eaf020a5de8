"""Weight selection (`select`): every student tensor is the teacher's at evenly spaced indices (checked
against an independent indexing in numpy), whole heads with rule=heads, the classifier left as built;
teachers from a timm name, a .safetensors or .pth file and a run directory, never unpickled; one-line
refusals for what cannot be selected; the report records where the weights came from."""

import json
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import structinit
from structinit.cli import main

TEACHER = dict(img_size=16, patch_size=4, depth=3, embed_dim=48, num_heads=6, num_classes=7)
STUDENT = dict(img_size=16, patch_size=4, depth=2, embed_dim=24, num_heads=3, num_classes=5)
ODD = dict(img_size=16, patch_size=4, depth=2, embed_dim=20, num_heads=2, num_classes=5)  # 48 -> 20: no step


def vit(**kwargs) -> torch.nn.Module:
    torch.manual_seed(sum(kwargs.values(), 0) if all(isinstance(v, int) for v in kwargs.values()) else 0)
    return timm.create_model("vit_tiny_patch16_224", **kwargs)


def spread(teacher: int, student: int) -> np.ndarray:
    """Evenly spaced indices, written independently of structinit's."""
    if teacher % student == 0:
        return np.arange(0, teacher, teacher // student)
    return np.rint(np.linspace(0, teacher - 1, student)).astype(int)


def expected(teacher: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return teacher[np.ix_(*[spread(t, s) for t, s in zip(teacher.shape, shape)])]


@pytest.mark.parametrize("student_kwargs", [STUDENT, ODD], ids=["every-k-th", "linspace"])
def test_every_student_tensor_is_the_teachers_at_evenly_spaced_indices_and_the_head_is_kept(student_kwargs):
    teacher, student = vit(**TEACHER), vit(**student_kwargs)
    head = {k: v.clone() for k, v in student.head.state_dict().items()}
    structinit.initialize(student, "select", teacher=teacher, seed=0)
    source = teacher.state_dict()
    checked = 0
    for name, tensor in student.state_dict().items():
        if name.startswith("head."):
            assert torch.equal(tensor, head[name.removeprefix("head.")])
            continue
        assert np.array_equal(tensor.numpy(), expected(source[name].numpy(), tuple(tensor.shape))), name
        checked += 1
    assert checked == len(student.state_dict()) - 2


def test_rule_heads_takes_each_student_head_from_one_teacher_head():
    teacher, student = vit(**TEACHER), vit(**STUDENT)  # 6 heads of 8 -> 3 heads of 8: teacher heads 0, 2, 4
    structinit.initialize(student, "select", teacher=teacher, rule="heads", seed=0)
    source = teacher.state_dict()
    channels = spread(48, 24)
    for i in range(2):
        qkv = source[f"blocks.{i}.attn.qkv.weight"].numpy().reshape(3, 6, 8, 48)
        want = qkv[:, [0, 2, 4]][..., channels].reshape(72, 24)
        assert np.array_equal(student.blocks[i].attn.qkv.weight.detach().numpy(), want)
        bias = source[f"blocks.{i}.attn.qkv.bias"].numpy().reshape(3, 6, 8)[:, [0, 2, 4]].reshape(72)
        assert np.array_equal(student.blocks[i].attn.qkv.bias.detach().numpy(), bias)
        proj = source[f"blocks.{i}.attn.proj.weight"].numpy().reshape(48, 6, 8)[channels][:, [0, 2, 4]]
        assert np.array_equal(student.blocks[i].attn.proj.weight.detach().numpy(), proj.reshape(24, 24))
        fc1 = source[f"blocks.{i}.mlp.fc1.weight"].numpy()
        assert np.array_equal(student.blocks[i].mlp.fc1.weight.detach().numpy(), expected(fc1, (96, 24)))


def test_uniform_rule_mixes_heads_where_the_head_rule_does_not():
    """Why rule=heads exists: 6 heads of 8 to 3 heads of 8 by every other row puts half of two teacher
    heads into one student head."""
    teacher = vit(**TEACHER)
    uniform, heads = vit(**STUDENT), vit(**STUDENT)
    structinit.initialize(uniform, "select", teacher=teacher, seed=0)
    structinit.initialize(heads, "select", teacher=teacher, rule="heads", seed=0)
    assert not torch.equal(uniform.blocks[0].attn.qkv.weight, heads.blocks[0].attn.qkv.weight)


def test_select_then_impulse_qk_solves_qk_on_the_selected_model_and_keeps_the_rest():
    teacher, plain, combined = vit(**TEACHER), vit(**STUDENT), vit(**STUDENT)
    structinit.initialize(plain, "select", teacher=teacher, seed=0)
    report = structinit.initialize(combined, "select", teacher=teacher, qk="impulse", seed=0)
    assert report.min_fidelity > 0.9
    for name, tensor in combined.state_dict().items():  # the Q/K biases: zero in both (the teacher's timm init)
        same = torch.equal(tensor, plain.state_dict()[name])
        assert same == (not name.endswith("attn.qkv.weight")), name
    with pytest.raises(ValueError, match="pos_scale and vproj act through the impulse init"):
        structinit.initialize(vit(**STUDENT), "select", teacher=teacher, vproj="mimetic")


def test_teachers_from_a_timm_name_safetensors_pth_and_a_run_directory_give_the_same_student(tmp_path, monkeypatch):
    teacher = vit(**TEACHER)
    state = {k: v.contiguous() for k, v in teacher.state_dict().items()}
    save_file(state, tmp_path / "t.safetensors")
    torch.save(state, tmp_path / "t.pth")
    torch.save({"model": state, "epoch": 3}, tmp_path / "wrapped.pt")
    monkeypatch.setattr("structinit.inits.teacher.pretrained", lambda name: teacher if name == "vit_fake" else None)
    students = {}
    for spec in ["vit_fake", tmp_path / "t.safetensors", tmp_path / "t.pth", tmp_path / "wrapped.pt"]:
        student = vit(**STUDENT)
        report = structinit.initialize(student, "select", teacher=str(spec), rule="heads", teacher_heads=6, seed=0)
        students[str(spec)] = student.state_dict()
        assert report.source["teacher_sha256"] == structinit.files.weights_sha256(state)
    first = next(iter(students.values()))
    assert all(all(torch.equal(s[k], first[k]) for k in first) for s in students.values())
    assert students and report.source["teacher"] == "file wrapped.pt"


def test_a_teacher_given_in_python_is_copied_and_hashed_once_for_the_init_and_its_report(monkeypatch):
    teacher = vit(**TEACHER)
    hashed = []

    def counting(state):
        hashed.append(len(state))
        return structinit.files.weights_sha256(state)

    monkeypatch.setattr("structinit.inits.teacher.weights_sha256", counting)
    for given in (teacher, teacher.state_dict()):
        hashed.clear()
        report = structinit.initialize(vit(**STUDENT), "select", teacher=given, seed=0)
        assert len(hashed) == 1 and report.source["teacher_sha256"] == structinit.files.weights_sha256(
            teacher.state_dict()
        )
        assert report.source["indices"].startswith("every k-th index")


def test_a_run_directory_teacher_gives_its_trained_weights_and_its_heads(tmp_path, capsys):
    run = tmp_path / "teacher"
    kwargs = "embed_dim=32,depth=2,num_heads=4"
    assert (
        main(
            [
                "train",
                "--model",
                "vit_digits",
                "--model-kwargs",
                kwargs,
                "--init",
                "timm",
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    trained = torch.load(run / "last.pt", weights_only=True)["model"]
    student = structinit.models.create_model(
        "vit_digits", num_classes=10, in_chans=1, data_size=8, embed_dim=16, depth=1, num_heads=2
    )
    report = structinit.initialize(student, "select", teacher=str(run), rule="heads", seed=0)  # heads: the run's
    assert report.source["teacher"] == "run teacher (last.pt)"
    fc2 = trained["blocks.0.mlp.fc2.weight"].numpy()
    assert np.array_equal(student.blocks[0].mlp.fc2.weight.detach().numpy(), expected(fc2, (16, 32)))
    out = tmp_path / "student"  # the trainer: --teacher for the label's select, recorded in the run's report
    flags = ["--model", "vit_digits", "--model-kwargs", "embed_dim=16,depth=1,num_heads=2", "--epochs", "1"]
    assert (
        main(["train", *flags, "--init", "select[rule=heads]", "--teacher", str(run), "--quiet", "--out", str(out)])
        == 0
    )
    recorded = json.loads((out / "init_report.json").read_text())
    assert recorded["source"]["teacher_sha256"] == report.source["teacher_sha256"]
    assert recorded["options"]["teacher"] == str(run)


def test_the_same_teacher_and_seed_give_bit_identical_students_across_processes(tmp_path):
    save_file({k: v.contiguous() for k, v in vit(**TEACHER).state_dict().items()}, tmp_path / "t.safetensors")
    kwargs = ",".join(f"{k}={v}" for k, v in STUDENT.items())
    command = [
        sys.executable,
        "-m",
        "structinit",
        "init",
        "vit_tiny_patch16_224",
        "--model-kwargs",
        kwargs,
        "--init",
        "select[qk=impulse]",
        "--teacher",
        str(tmp_path / "t.safetensors"),
        "--seed",
        "3",
    ]
    digests = []
    for i in range(2):
        out = tmp_path / f"report{i}.json"
        subprocess.run(
            [*command, "--json", str(out), "--save", str(tmp_path / f"s{i}.safetensors")],
            check=True,
            capture_output=True,
        )
        digests.append(json.loads(out.read_text())["weights_sha256"])
    assert digests[0] == digests[1]
    with safe_open(str(tmp_path / "s0.safetensors"), "pt") as f:
        assert f.metadata()["teacher"] == "file t.safetensors"
        assert len(f.metadata()["teacher_sha256"]) == 64


def test_a_pickled_teacher_is_refused_in_one_line_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"blocks.0.attn.qkv.weight": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(ValueError, match=r"holds Python objects beyond tensors") as error:
        structinit.initialize(vit(**STUDENT), "select", teacher=str(tmp_path / "evil.pth"))
    assert "\n" not in str(error.value) and not marker.exists()
    (tmp_path / "junk.pth").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a torch\.save archive"):
        structinit.initialize(vit(**STUDENT), "select", teacher=str(tmp_path / "junk.pth"))


@pytest.mark.parametrize(
    "teacher_kwargs, student_kwargs, options, message",
    [
        (STUDENT, TEACHER, {}, r"the student is deeper than the teacher: 3 blocks against 2"),
        (
            {**TEACHER, "depth": 2},
            {**STUDENT, "embed_dim": 96},
            {},
            r"the student is wider than the teacher: "
            r"cls_token is \(1, 1, 96\) in the student, \(1, 1, 48\) in the teacher",
        ),
        (
            TEACHER,
            {**STUDENT, "num_heads": 4},
            {"rule": "heads"},
            r"student's 4 heads of 6 cannot each come from "
            r"one of the teacher's 6 heads of 8",
        ),
        (TEACHER, {**STUDENT, "img_size": 32}, {}, r"position embeddings hold other token counts"),
    ],
    ids=["deeper", "wider", "heads-do-not-divide", "tokens"],
)
def test_what_cannot_be_selected_is_refused_in_one_line(teacher_kwargs, student_kwargs, options, message):
    with pytest.raises(ValueError, match=message) as error:
        structinit.initialize(vit(**student_kwargs), "select", teacher=vit(**teacher_kwargs), **options)
    assert "\n" not in str(error.value)


def test_another_family_or_no_teacher_or_unknown_heads_are_refused(tmp_path):
    mixer = timm.models.mlp_mixer.MlpMixer(num_classes=5, img_size=16, patch_size=4, num_blocks=2, embed_dim=48)
    with pytest.raises(ValueError, match=r"the teacher has no cls_token .*another family"):
        structinit.initialize(vit(**STUDENT), "select", teacher=mixer)
    with pytest.raises(ValueError, match="select needs a teacher"):
        structinit.initialize(vit(**STUDENT), "select")
    save_file({k: v.contiguous() for k, v in vit(**TEACHER).state_dict().items()}, tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match="give teacher_heads=N"):
        structinit.initialize(vit(**STUDENT), "select", teacher=str(tmp_path / "t.safetensors"), rule="heads")
    with pytest.raises(ValueError, match="neither a file, a run directory nor a timm model name"):
        structinit.initialize(vit(**STUDENT), "select", teacher="no_such_model_or_file")


def test_the_cli_names_a_missing_or_misplaced_teacher(tmp_path, capsys):
    assert main(["train", "--init", "select", "--epochs", "1", "--out", str(tmp_path / "a")]) == 2
    assert "--init select selects from a larger model: give it with --teacher" in capsys.readouterr().err
    assert main(["train", "--init", "timm", "--teacher", "x", "--epochs", "1", "--out", str(tmp_path / "b")]) == 2
    assert "--init timm does not read it" in capsys.readouterr().err
    assert main(["compare", "--inits", "timm", "--teacher", "x", "--out", str(tmp_path / "c")]) == 2
    assert "--inits lists none" in capsys.readouterr().err


def test_selection_study_smoke_trains_teachers_then_every_student_and_resumes_from_its_ledger(tmp_path):
    from conftest import load_benchmark, make_imagefolder

    study = load_benchmark("study_selection")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=study.TEACHER_CLASSES + study.STUDENT_CLASSES)
    args = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "out"), "--jobs", "1"]
    with pytest.raises(SystemExit):  # students before any teacher: named, nothing trains
        study.main([*args, "--part", "students"])
    assert study.main([*args, "--part", "teachers", "--teachers", "timm", "--threads", "1"]) == 0  # one a session
    assert "torch_threads: 1\n" in (tmp_path / "out" / "teachers" / "timm" / "config.yaml").read_text()
    assert study.main([*args, "--part", "students"]) == 0
    ledger = tmp_path / "out" / "docs" / study.LEDGER
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(rows) == len(study.student_runs(smoke=True)) - 2  # all but the impulse teacher's (val, test)
    assert not any(r["grid"].startswith("students-impulse-teacher") for r in rows)
    assert study.main([*args, "--part", "teachers", "--teachers", "impulse"]) == 0
    assert study.main([*args, "--part", "students"]) == 0
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted((r["split"], r["init"], r["grid"]) for r in rows) == sorted(
        ("val" if val else "test", study.STUDENT_INITS[init][0], study.grid_of(init, val))
        for val, _, init in study.student_runs(smoke=True)
    )
    text = (tmp_path / "out" / "docs" / "selection.md").read_text()
    assert "| timm | timm | 1 |" in text and "select (impulse teacher)" in text
    assert (tmp_path / "out" / "docs" / "figures" / study.FIGURE).stat().st_size > 0 and study.FIGURE in text
    assert f", {study.STUDENT_SHOWN}, " in text and study.STUDENT_MODEL[0] not in text  # sizes, not timm's name
    from structinit.training.provenance import device_name

    teacher_row = next(
        line
        for line in text.splitlines()
        if line.startswith("| impulse | impulse[target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep] | 1 |")
    )
    assert teacher_row.endswith(f" | {device_name(torch.device('cpu'))} |")  # where its hours were spent
    # on a checkout with the ledger and no student directories, nothing trains again
    import shutil

    for grid in ("students", "students-val", "students-impulse-teacher", "students-impulse-teacher-val"):
        shutil.rmtree(tmp_path / "out" / grid)
    assert study.student_configs(f"imagefolder:{data}", tmp_path / "out", ledger.parent, study.SMOKE, True) == []


def test_a_torchvision_vit_selects_by_name_too_and_the_head_rule_is_refused_there():
    from torchvision.models.vision_transformer import VisionTransformer

    def tv(layers: int, heads: int, width: int) -> VisionTransformer:
        torch.manual_seed(width)
        return VisionTransformer(16, 4, layers, heads, width, 2 * width, num_classes=5)

    teacher, student = tv(3, 4, 32), tv(2, 2, 16)
    head = {k: v.clone() for k, v in student.heads.state_dict().items()}
    structinit.initialize(student, "select", teacher=teacher, seed=0)
    source = teacher.state_dict()
    for name, tensor in student.state_dict().items():
        if name.startswith("heads."):
            assert torch.equal(tensor, head[name.removeprefix("heads.")])  # the classifier is the student's
        else:
            assert np.array_equal(tensor.numpy(), expected(source[name].numpy(), tuple(tensor.shape))), name
    with pytest.raises(ValueError, match=r"^rule=heads knows timm's ViT attention .*: use rule=uniform$"):
        structinit.initialize(tv(2, 2, 16), "select[rule=heads]", teacher=teacher, teacher_heads=4)
