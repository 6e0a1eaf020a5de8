# ruff: noqa: E501  (one case a line: commands and code strings read best whole)
"""The adversarial probes of issue 60 (round four: 84 cases) and issue 67 (round five: new triggers of its
rules, below the first 84), kept so that the next round can rerun them and add its own. Each case is a
command or a library call in a scratch directory; a case passes when it ends as expected (rc 0 doing what
it should, or rc 2 with one line on stderr, no traceback, nothing left by a refusal).

    .venv/bin/python benchmarks/probe_trust.py      # about 20 minutes on 2 cores; prints the counts and failures
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S = str(ROOT / ".venv" / "bin" / "structinit")
PY = str(ROOT / ".venv" / "bin" / "python")
T = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "5", "-b", "25", "--quiet", "--epochs", "1"]
root = Path(tempfile.mkdtemp())
os.chdir(root)
results = []


def run(name, argv, expect=(0, 2), check=None, stdin=None):
    p = subprocess.run([S, *argv], capture_output=True, text=True, timeout=300, input=stdin)
    err = p.stderr.strip().splitlines()
    ok = p.returncode in expect and "Traceback" not in p.stderr
    if p.returncode == 2:
        ok = ok and len([line for line in err if "error:" in line]) == 1 and len(err[-1]) < 2000
    if check is not None and ok:
        try:
            ok = bool(check(p))
        except Exception:
            ok = False
    results.append((name, ok, p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:160]))


def pyrun(name, code):
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    ok = p.returncode == 0 and "OK" in p.stdout
    results.append(
        (
            name,
            ok,
            p.returncode,
            (p.stdout + p.stderr).strip().splitlines()[-1][:160] if (p.stdout + p.stderr).strip() else "",
        )
    )


# a base run to tamper with
subprocess.run([S, "train", *T, "--out", "base"], check=True, capture_output=True)


def copy(name):
    shutil.copytree("base", name)
    return Path(name)


# --- flags
run("epochs 0", ["train", *T[:-2], "--epochs", "0", "--out", "e0"], (2,), lambda p: not Path("e0").exists())
run("epochs as float text", ["train", *T[:-2], "--epochs", "1e3", "--out", "eh"], (2,))
run("lr negative", ["train", *T, "--lr", "-1", "--out", "x1"], (2,))
run("lr nan", ["train", *T, "--lr", "nan", "--out", "x2"], (2,))
run("batch 0", ["train", *T, "-b", "0", "--out", "x3"], (2,))
run("seed -1", ["train", *T, "--seed", "-1", "--out", "x4"], (2,))
run("seed 2**40", ["train", *T, "--seed", str(2**40), "--out", "x5"], (2,))
run("drop-path 1", ["train", *T, "--drop-path", "1", "--out", "x6"], (2,))
run("smoothing 1", ["train", *T, "--smoothing", "1", "--out", "x7"], (2,))
run("mixup -1", ["train", *T, "--mixup", "-1", "--out", "x8"], (2,))
run("aa garbage", ["train", *T, "--aa", "rand-zz", "--out", "x9"], (2,))
run("clip-grad 0", ["train", *T, "--clip-grad", "0", "--out", "x10"], (2,))
run("ema 1", ["train", *T, "--ema-decay", "1", "--out", "x11"], (2,))
run("eval-every 0", ["train", *T, "--eval-every", "0", "--out", "x12"], (2,))
run("snapshot 5 of 1", ["train", *T, "--snapshot-epochs", "5", "--out", "x13"], (2,))
run("stop-after 0", ["train", *T, "--stop-after", "0", "--out", "x14"], (2,))
run("workers -1", ["train", *T, "--workers", "-1", "--out", "x15"], (2,))
run("device nonsense", ["train", *T, "--device", "tpu:9", "--out", "x16"], (2,))
run("device cuda absent", ["train", *T, "--device", "cuda", "--out", "x17"], (2,))
run("classes unknown", ["train", *T, "--classes", "zebra", "--out", "x18"], (2,))
run("num-classes wrong", ["train", *T, "--num-classes", "7", "--out", "x19"], (2,))
run("val-per-class too many", ["train", *T, "--val-per-class", "500", "--out", "x20"], (2,))
run("train-fraction 2", ["train", *T[:2], "--train-fraction", "2", "--out", "x21"], (2,))
run("per-class and fraction", ["train", *T, "--train-fraction", "0.5", "--out", "x22"], (2,))
run("eval-per-class 0", ["train", *T, "--eval-per-class", "0", "--out", "x23"], (2,))
run("eval-final bogus", ["train", *T, "--eval-final", "half", "--out", "x24"], (2,))
run("init-ckpt missing", ["train", *T, "--initial-checkpoint", "nope.pt", "--out", "x25"], (2,))
Path("garbage.pt").write_bytes(b"not a checkpoint")
run(
    "init-ckpt garbage",
    ["train", *T, "--initial-checkpoint", "garbage.pt", "--out", "x26"],
    (2,),
    lambda p: not Path("x26").exists(),
)
Path("weights.txt").write_text("x")
run("init-ckpt wrong suffix", ["train", *T, "--initial-checkpoint", "weights.txt", "--out", "x27"], (2,))
os.mkfifo("fifo.pt")
run("init-ckpt fifo", ["train", *T, "--initial-checkpoint", "fifo.pt", "--out", "x28"], (2,))
run("init-ckpt a dir", ["train", *T, "--initial-checkpoint", "base", "--out", "x29"], (2,))
run("init-ckpt last.pt of a run", ["train", *T, "--initial-checkpoint", "base/last.pt", "--out", "x30"], (0,))
run(
    "model-kwargs pretrained",
    ["train", *T[:-2], "--epochs", "1", "--model-kwargs", "pretrained=True", "--out", "x31"],
    (2,),
)
run("model-kwargs nonsense key", ["train", *T[2:], "--model-kwargs", "flux=3", "--out", "x32"], (2,))
run("model unknown", ["train", *T, "--model", "vit_nope", "--out", "x33"], (2,))
run("init unknown option", ["train", *T, "--init", "impulse[zz=1]", "--out", "x34"], (2,))
run("init bracket open", ["train", *T, "--init", "impulse[", "--out", "x35"], (2,))
run("init label nested", ["train", *T, "--init", "impulse[target_fidelity=[[[1]]]]", "--out", "x36"], (2,))
run("target_fidelity 1", ["train", *T, "--init", "impulse[target_fidelity=1]", "--out", "x37"], (2,))
run("kernel_size 4", ["train", *T, "--init", "impulse[kernel_size=4]", "--out", "x38"], (2,))
run("kernel_size 99", ["train", *T, "--init", "impulse[kernel_size=99]", "--out", "x39"], (2,))
Path("c.yaml").write_text("lr: [1, 2]\n")
run("config lr list", ["train", *T, "-c", "c.yaml", "--out", "x40"], (2,))
Path("c2.yaml").write_text("a: &x 1\nb: *x\n")
run("config alias", ["train", *T, "-c", "c2.yaml", "--out", "x41"], (2,))
Path("c3.yaml").write_text("out: etcish\n")
Path("etcish").mkdir()
Path("etcish/passwd").write_text("x")
run(
    "config out a dir of other files",
    ["train", *T[:-2], "--epochs", "1", "-c", "c3.yaml"],
    (0,),
    lambda p: Path("etcish/passwd").read_text() == "x",
)
Path("c4.yaml").write_text("\x00\x01")
run("config binary", ["train", *T, "-c", "c4.yaml", "--out", "x43"], (2,))
run("config dir", ["train", *T, "-c", ".", "--out", "x44"], (2,))
# --- records and resume
r = copy("r1")
(r / "metrics.jsonl").write_text("{not json\n")
run("metrics.jsonl garbage resume", ["train", "--resume", "--out", "r1", "--epochs", "2"], (0, 2))
r = copy("r2")
(r / "last.pt").write_bytes(b"\x00" * 10)
run("last.pt garbage resume", ["train", "--resume", "--out", "r2", "--epochs", "2"], (0, 2))
r = copy("r3")
(r / "config.yaml").write_text("lr: " + "[" * 5000 + "]" * 5000 + "\n")
run("config.yaml deep resume", ["train", "--resume", "--out", "r3", "--epochs", "2"], (0, 2))
r = copy("r4")
(r / "summary.json").write_text("[" * 200000 + "]" * 200000)
run("summary deep", ["train", "--resume", "--out", "r4", "--epochs", "2"], (0, 2))
r = copy("r5")
(r / "init_report.json").write_text('{"options": 5}')
run("init_report options not map compare", ["compare", *T, "--inits", "timm", "--seeds", "0", "--out", "g5"], (0, 2))
run("resume lr change", ["train", "--resume", "--out", copy("r6").name, "--epochs", "2", "--lr", "0.0005"], (0,))
run(
    "resume model change",
    ["train", "--resume", "--out", copy("r7").name, "--epochs", "2", "--model", "vit_d6_p4"],
    (2,),
)
run("resume no run", ["train", "--resume", "--out", "nothing-here"], (2,), lambda p: not Path("nothing-here").exists())
Path("afile").write_text("x")
run("out is a file", ["train", *T, "--out", "afile"], (2,))
run("out under a file", ["train", *T, "--out", "afile/sub"], (2,))
os.symlink("base", "link")
run("out is a link", ["train", *T, "--out", "link"], (2,))
run("cache-dir under a file", ["train", *T, "--cache-dir", "afile/c", "--out", "x50"], (0, 2))
os.makedirs("deepcache/digests", exist_ok=True)
run("compare twice same", ["compare", *T, "--inits", "timm,timm", "--seeds", "0", "--out", "g1"], (2,))
run("compare seeds dup", ["compare", *T, "--inits", "timm", "--seeds", "0,0", "--out", "g2"], (2,))
run(
    "compare per-class 0",
    ["compare", *T[:2], "--per-class", "0", "--inits", "timm", "--seeds", "0", "--out", "g3"],
    (2,),
)
run("compare into a run", ["compare", *T, "--inits", "timm", "--seeds", "0", "--out", "base"], (2,))
run("choose one seed", ["choose", *T, "--seeds", "0", "--out", "c1"], (2,))
run("choose structured default", ["choose", *T, "--structured", "default", "--out", "c2"], (2,))
run("choose minutes 1e-9", ["choose", *T[:-2], "--minutes", "1e-9", "--out", "c3", "--val-per-class", "2"], (0, 2))
run("init save to dir", ["init", "vit_digits", "--save", "base"], (2,))
run("init save bad suffix", ["init", "vit_digits", "--save", "w.txt"], (2,))
run("init json into dir", ["init", "vit_digits", "--json", "base"], (2,))
run("init teacher missing", ["init", "vit_digits", "--init", "select", "--teacher", "nope.safetensors"], (2,))
run("init seed text", ["init", "vit_digits", "--seed", "abc"], (2,))
run("init model empty", ["init", ""], (2,))
run("init kernel 0", ["init", "vit_digits", "--init", "impulse[kernel_size=0]"], (2,))
run("attention on non-run", ["attention", "afile", "--out", "a.png"], (2,))
run("attention images 0", ["attention", "base", "--images", "0", "--out", "a.png"], (2,))
run("attention out .txt", ["attention", "base", "--out", "a.txt"], (2,))
run("rank images -5", ["rank", "base", "--images", "-5", "--out", "r.png"], (2,))
run("upgrade garbage", ["upgrade-checkpoint", "garbage.pt"], (2,))
run("demo seeds bad", ["demo", "--seeds", "a", "--out", "d1"], (2,))
run("demo epochs 0", ["demo", "--epochs", "0", "--out", "d2"], (2,), lambda p: not Path("d2").exists())
# library
VIT = "m = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=4, depth=1)\n"
pyrun(
    "load_init on .pt",
    "import structinit\ntry:\n structinit.load_init('garbage.pt')\nexcept ValueError as e: print('OK', e)",
)
pyrun(
    "initialize bad method type",
    "import structinit, timm\n" + VIT + "try:\n structinit.initialize(m, 5)\nexcept TypeError: print('OK')",
)
pyrun(
    "initialize on a Linear",
    "import structinit, torch\ntry:\n structinit.initialize(torch.nn.Linear(2, 2), 'impulse')\n"
    "except (TypeError, ValueError) as e: print('OK', str(e)[:80])",
)
pyrun(
    "fidelity on 3-d images",
    "import structinit, timm, torch\n" + VIT + "try:\n structinit.fidelity(m, torch.zeros(3, 32, 32))\n"
    "except ValueError: print('OK')",
)
pyrun(
    "save_init overwrite refused",
    "import structinit, timm\n" + VIT + "structinit.save_init(m, 's.pt')\ntry:\n structinit.save_init(m, 's.pt')\n"
    "except ValueError: print('OK')",
)
# --- round five (issue 67): new triggers of its rules, none of them the issue's own list
DIG = ["--data", "digits", "--per-class", "5", "-b", "25", "--quiet", "--epochs", "1", "--warmup-epochs", "0"]
MK = (
    "import torch, timm\nfrom structinit.models import create_model\n"
    "m = create_model('vit_digits', num_classes=10, in_chans=1, data_size=8)\nsd = dict(m.state_dict())\n"
)
QKV = "k = [n for n in sd if n.endswith('qkv.weight')][0]\n"


def weights(name, change):
    """A state dict of digits' default model, changed by `change` (Python on sd and k), saved as `name`."""
    code = MK + QKV + change + f"\ntorch.save(sd, {name!r})\nprint('OK')"
    subprocess.run([PY, "-c", code], check=True, capture_output=True)
    return name


def gone(name):
    return lambda p: not Path(name).exists()


# rule 3: weights, wherever they enter
for tag, change in [
    ("float64 tensor", "sd[k] = sd[k].double()"),
    ("module. prefix", "sd = {'module.' + n: t for n, t in sd.items()}"),
    ("inside state_dict_ema", "sd = {'state_dict_ema': sd}"),
    ("a transposed view", "sd[k] = sd[k].t().contiguous().t()"),
    ("float8 tensor", "sd[k] = sd[k].to(torch.float8_e4m3fn)"),
]:
    run(
        f"init-ckpt {tag} trains",
        ["train", *DIG, "--initial-checkpoint", weights(f"{tag}.pt", change), "--out", tag],
        (0,),
    )
for tag, change in [
    ("a string value", "sd[k] = 'weights'"),
    ("empty dict", "sd = {}"),
    ("a list of tensors", "sd = list(sd.values())"),
    ("int8 tensor", "sd[k] = sd[k].to(torch.int8)"),
    ("a -inf bias", "sd[k.replace('weight', 'bias')].fill_(float('-inf'))"),
    ("a 2e6 entry", "sd[k][0, 0] = 2e6"),
    ("a NaN in float8", "sd[k] = sd[k].clone(); sd[k][0, 0] = float('nan'); sd[k] = sd[k].to(torch.float8_e4m3fn)"),
    ("missing head", "sd.pop('head.weight')"),
    ("head of 11 classes", "sd['head.weight'] = torch.zeros(11, sd['head.weight'].shape[1])"),
    ("a tensor on meta", "sd['head.bias'] = sd['head.bias'].to('meta')"),
    ("a csr tensor", "sd[k] = sd[k].to_sparse_csr()"),
]:
    name = tag.replace(" ", "_")
    run(
        f"init-ckpt {tag}",
        ["train", *DIG, "--initial-checkpoint", weights(f"{name}.pt", change), "--out", name],
        (2,),
        gone(name),
    )
for tag, blob in [
    ("header length 2**40", (2**40).to_bytes(8, "little")),
    ("header not JSON", (8).to_bytes(8, "little") + b"not json"),
    ("header a JSON list", (8).to_bytes(8, "little") + b"[1,2,3] "),
    ("an F8 dtype", None),
    ("7 bytes", b"\x01" * 7),
]:
    if blob is None:
        head = b'{"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}'
        head += b" " * (-len(head) % 8)
        blob = len(head).to_bytes(8, "little") + head + b"\x00\x00"
    name = tag.replace(" ", "_").replace("*", "") + ".safetensors"
    Path(name).write_bytes(blob)
    run(
        f"safetensors {tag}",
        ["train", *DIG, "--initial-checkpoint", name, "--out", "st_" + name],
        (2,),
        gone("st_" + name),
    )
    pyrun(
        f"load_init of safetensors {tag}",
        f"import structinit\ntry:\n structinit.load_init({name!r})\nexcept ValueError as e: print('OK', e)",
    )
subprocess.run([S, "init", "vit_digits", "--save", "digits.safetensors"], check=True, capture_output=True)
pyrun(
    "load_init: the record's seed edited keeps its sha256 check",
    "import structinit, json\nfrom safetensors import safe_open\nfrom safetensors.torch import load_file, save_file\n"
    "r = dict(safe_open('digits.safetensors', 'pt').metadata()); r['weights_sha256'] = 'ab' * 32\n"
    "save_file(load_file('digits.safetensors'), 'edited.safetensors', metadata=r)\n"
    "try:\n structinit.load_init('edited.safetensors')\nexcept ValueError as e: print('OK', e)",
)
pyrun(
    "load_init: a safetensors of another tool has no record to build from",
    "import structinit, torch\nfrom safetensors.torch import save_file\nsave_file({'w': torch.ones(2)}, 'other.safetensors')\n"
    "try:\n structinit.load_init('other.safetensors')\nexcept ValueError as e: print('OK', e)",
)
pyrun(
    "save_init of a load_init model, as .pt too",
    "import structinit\nm, r = structinit.load_init('digits.safetensors')\nstructinit.save_init(m, 'again.pt')\n"
    "structinit.save_init(m, 'again.safetensors'); print('OK')",
)
run("teacher a FIFO", ["init", "vit_digits", "--init", "select", "--teacher", "fifo.pt"], (2,))
run("teacher a .txt file", ["init", "vit_digits", "--init", "select", "--teacher", "weights.txt"], (2,))
run("teacher non-finite", ["init", "vit_digits", "--init", "select", "--teacher", "a_-inf_bias.pt"], (2,))
run("teacher a csr file", ["init", "vit_digits", "--init", "select", "--teacher", "a_csr_tensor.pt"], (2,))
r = copy("r8")
subprocess.run(
    [
        PY,
        "-c",
        "import torch; c = torch.load('r8/last.pt', weights_only=True)\n"
        "c['model'] = {n: (t.long() if n == 'head.weight' else t) for n, t in c['model'].items()}\n"
        "torch.save(c, 'r8/last.pt')",
    ],
    check=True,
)
run("resume: last.pt with an int64 head", ["train", "--resume", "--out", "r8", "--epochs", "2"], (2,))
run("attention: last.pt with an int64 head", ["attention", "r8", "--out", "r8.png"], (2,), gone("r8.png"))
r = copy("r9")
subprocess.run(
    [
        PY,
        "-c",
        "import torch; c = torch.load('r9/last.pt', weights_only=True)\n"
        "c['model']['head.bias'].fill_(float('nan')); torch.save(c, 'r9/last.pt')",
    ],
    check=True,
)
run("attention: last.pt with a NaN head", ["attention", "r9", "--out", "r9.png"], (2,), gone("r9.png"))
run("teacher: a run whose last.pt is NaN", ["init", "vit_digits", "--init", "select", "--teacher", "r9"], (2,))
shutil.copy("float64 tensor.pt", "gone.pt")
subprocess.run([S, "train", *DIG, "--initial-checkpoint", "gone.pt", "--out", "rg"], check=True, capture_output=True)
os.remove("gone.pt")
run("resume after the initial file is gone", ["train", "--resume", "--out", "rg", "--epochs", "2"], (0,))
run("attention after the initial file is gone", ["attention", "rg", "--out", "rg.png"], (0,))
# rule 4: memory estimated before it is allocated
run(
    "init: a 10^7-wide model", ["init", "vit_tiny_patch16_224", "--model-kwargs", "embed_dim=9999999,num_heads=1"], (2,)
)
run("init: 10^9 classes on a digits model", ["init", "vit_digits", "--num-classes", "1000000000"], (2,))
run("train: --img-size 20000", ["train", *DIG, "--img-size", "20000", "--out", "big1"], (2,), gone("big1"))
run("train: rand-n100000000 at -b 25", ["train", *DIG, "--aa", "rand-n100000000", "--out", "big2"], (2,), gone("big2"))
run(
    "train: mlp_ratio 1e6",
    ["train", *DIG, "--model-kwargs", "mlp_ratio=1000000.0", "--out", "big3"],
    (2,),
    gone("big3"),
)
run(
    "compare: 10^8-wide grid model",
    ["compare", *T, "--model-kwargs", "embed_dim=99999999", "--inits", "timm", "--seeds", "0", "--out", "big4"],
    (2,),
)
# rule 5: values timm reads otherwise
for kw in [
    "no_embed_class=yes",
    "qkv_bias=n",
    "class_token=OFF",
    "mlp_ratio=-inf",
    "init_values=nan",
    "drop_rate=Infinity",
]:
    run(f"model-kwargs {kw}", ["train", *DIG, "--model-kwargs", kw, "--out", "kw"], (2,), gone("kw"))
run("model-kwargs qkv_bias=False trains", ["train", *DIG, "--model-kwargs", "qkv_bias=False", "--out", "kwf"], (0,))
for spec in ["rand-n2-n3", "rand-inc1-inc0", "rand-p0.5-p0.2", "rand-mmax10-mmax5"]:
    run(f"randaugment {spec}", ["train", *DIG, "--aa", spec, "--out", "ra"], (2,), gone("ra"))
run(
    "--output and --out differ",
    ["train", *DIG, "--output", "o1", "--out", "o2"],
    (2,),
    lambda p: not Path("o1").exists() and not Path("o2").exists(),
)
run("--torchcompile and --compile agree", ["train", *DIG, "--no-compile", "--out", "cc"], (0,))
run("-b and --batch-size differ", ["train", *DIG, "-b", "5", "--batch-size", "25", "--out", "bb"], (2,), gone("bb"))
run(
    "--model-ema-decay and --ema-decay differ",
    ["train", *DIG, "--ema-decay", "0.9", "--model-ema-decay", "0.99", "--out", "em"],
    (2,),
)
# the unnamed kinds' kin: optimisers, sizes, mixed maps
for opt in ["lookahead_adahessian", "bnbsgd8bit", "fusedlamb", "fusednovograd"]:
    run(f"--opt {opt} on a CPU", ["train", *DIG, "--opt", opt, "--out", "op"], (2,), gone("op"))
run("--opt lookahead_lion trains", ["train", *DIG, "--opt", "lookahead_lion", "--out", "opl"], (0,))
run(
    "init cait with kaiming: shares within [0, 1]",
    ["init", "cait_xxs24_224", "--model-kwargs", "img_size=32,patch_size=4,depth=1", "--init", "kaiming"],
    (0,),
    lambda p: "-0." not in p.stdout,
)
IMG = "import structinit, timm, torch\nm = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=4, depth=1)\nr = structinit.initialize(m, 'mimetic')\n"
for tag, images in [
    ("int32 images", "torch.zeros(2, 3, 32, 32, dtype=torch.int32)"),
    ("inf images", "torch.full((2, 3, 32, 32), float('inf'))"),
    ("a 5-d tensor", "torch.zeros(1, 2, 3, 32, 32)"),
    ("a list", "[torch.zeros(3, 32, 32)]"),
    ("2 channels", "torch.zeros(2, 2, 32, 32)"),
    ("48 px", "torch.zeros(2, 3, 48, 48)"),
]:
    pyrun(
        f"measure_on_images: {tag}",
        IMG + f"try:\n structinit.measure_on_images(r, m, {images})\nexcept ValueError as e: print('OK', e)",
    )
pyrun(
    "measure_on_images: a report of another width",
    IMG + "o = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=4, depth=2)\n"
    "try:\n structinit.measure_on_images(r, o, torch.zeros(2, 3, 32, 32))\nexcept ValueError as e: print('OK', e)",
)
pyrun(
    "fidelity on a (0, 3, 32, 32) batch",
    IMG + "try:\n structinit.fidelity(m, torch.zeros(0, 3, 32, 32))\nexcept ValueError as e: print('OK', e)",
)
pyrun(
    "a bf16 ViT-Ti takes the table in seconds",
    "import structinit, timm, time, torch, os, tempfile\nos.environ['STRUCTINIT_CACHE'] = tempfile.mkdtemp()\n"
    "m = timm.create_model('vit_tiny_patch16_224').bfloat16(); t = time.time(); r = structinit.initialize(m, 'impulse')\n"
    "print('OK' if time.time() - t < 10 and 'table' in r.source['target_fidelity'] else 'slow')",
)
# writes: rule 1's kin
pyrun(
    "8 threads saving one new .pt: one saves",
    "import structinit, timm, threading\nm = timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=1)\n"
    "out = []\ndef go():\n try:\n  structinit.save_init(m, 'race.pt'); out.append(1)\n except ValueError: out.append(0)\n"
    "ts = [threading.Thread(target=go) for _ in range(8)]\n[t.start() for t in ts]; [t.join() for t in ts]\n"
    "import os\nprint('OK' if sum(out) == 1 and not [f for f in os.listdir('.') if f.startswith('.race')] else out)",
)
pyrun(
    "save_init overwrite=True from 4 threads leaves one whole file",
    "import structinit, timm, threading, torch\nm = timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=1)\n"
    "ts = [threading.Thread(target=lambda: structinit.save_init(m, 'over.pt', overwrite=True)) for _ in range(4)]\n"
    "[t.start() for t in ts]; [t.join() for t in ts]\n"
    "print('OK' if torch.load('over.pt', weights_only=True).keys() == m.state_dict().keys() else 'torn')",
)
os.mkfifo("out.fifo")
run("rank --out a FIFO", ["rank", "base", "--out", "out.fifo"], (2,))
run("init --json a directory-as-file path", ["init", "vit_digits", "--json", "afile/x.json"], (2,))
bad = [r for r in results if not r[1]]
print(f"{len(results)} cases, {len(results) - len(bad)} pass, {len(bad)} fail")
for name, _ok, rc, last in bad:
    print(f"FAIL {name}: rc {rc}: {last}")
