"""`structinit demo` sized to the CPU it finds: the rule that turns a measured pace into its epochs."""

from structinit.cli.demo import FEWEST_EPOCHS, MOST_EPOCHS, TRAINING_SECONDS, demo_epochs


def test_the_demo_trains_the_epochs_its_runs_fit_in_its_time_within_its_bounds():
    assert TRAINING_SECONDS == 180.0  # 3 min of training: the demo in 5 min with its start-up and 12 figures
    assert demo_epochs(setup=5.0, epoch=1.0, runs=4) == MOST_EPOCHS == 30  # a fast CPU: the README's demo
    assert demo_epochs(setup=5.0, epoch=3.3, runs=4) == 12  # (180 / 4 - 5) / 3.3: a 2-core CPU without AVX-512
    assert demo_epochs(setup=5.0, epoch=3.3, runs=8) == 5  # two seeds: half the epochs
    assert demo_epochs(setup=5.0, epoch=10.0, runs=4) == FEWEST_EPOCHS == 4  # slower still: the fewest
    assert demo_epochs(setup=60.0, epoch=1.0, runs=4) == FEWEST_EPOCHS  # its start alone past the time


def test_the_demo_says_what_it_chose_and_why(tmp_path, capsys):
    from structinit.cli.demo import sized
    from structinit.training.settings import TrainConfig

    epochs, warmup = sized(TrainConfig(data="digits", model="vit_digits"), tmp_path / "demo", 4)
    line = capsys.readouterr().out
    assert warmup is None and FEWEST_EPOCHS <= epochs <= MOST_EPOCHS
    assert line.startswith(f"demo: 4 runs of {epochs} epochs, sized to this CPU (") and "--epochs N sets them" in line
