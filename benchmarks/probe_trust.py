"""The adversarial probe of issue 60 (round four), kept so that the next round can rerun it and add its own:
84 cases, each a command or a library call in a scratch directory; a case passes when it ends as expected
(rc 0 doing what it should, or rc 2 with one line on stderr, no traceback, nothing left by a refusal).

    .venv/bin/python benchmarks/probe_trust.py      # about 10 minutes on 2 cores; prints the counts and failures
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
bad = [r for r in results if not r[1]]
print(f"{len(results)} cases, {len(results) - len(bad)} pass, {len(bad)} fail")
for name, _ok, rc, last in bad:
    print(f"FAIL {name}: rc {rc}: {last}")
