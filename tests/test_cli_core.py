import json
import re

import pytest
from click.testing import CliRunner

from jemeval.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_help_and_version():
    r = run("--help")
    assert r.exit_code == 0 and "plugins" in r.output and "list" in r.output
    assert run("--version").output.startswith("jemeval, version")


def test_unknown_command_suggests():
    r = run("plugin")
    assert r.exit_code == 2 and "did you mean 'plugins'" in r.output


def test_list_json_and_glob():
    r = run("list", "models", "w*", "--json")
    assert r.exit_code == 0
    assert [m["name"] for m in json.loads(r.output)["model"]] == ["wrn"]
    r = run("list", "scores")
    assert "gradnorm" in r.output and "[jemeval.builtins.scores]" in r.output


def test_plugins_json_lists_builtins_with_versions():
    import jemeval

    r = run("plugins", "--json")
    report = {p["name"]: p for p in json.loads(r.output)}
    assert report["jemeval.builtins.models"]["version"] == jemeval.__version__
    assert report["jemeval.builtins.models"]["registered"]["model"] == ["cnn", "timm", "wrn"]


@pytest.mark.any_device
def test_bad_component_options_are_one_line_usage_errors(digits_classifier_ckpt):
    r = run("ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--score", "energy:t=3")
    assert r.exit_code == 2 and "score 'energy' has no option 't' (did you mean 'T'?); its options: T" in r.output
    r = run("robust", "--model", str(digits_classifier_ckpt), "--norm", "l2", "--attack", "pgd:bogus=1", "--n", "5")
    assert r.exit_code == 2 and "attack 'pgd' has no option 'bogus'" in r.output
    assert "Traceback" not in r.output


@pytest.mark.any_device
def test_more_user_mistakes_are_one_line(digits_classifier_ckpt, tmp_path):
    ckpt = str(digits_classifier_ckpt)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    r = run("calibrate", "--model", ckpt, "--out", str(blocker / "sub" / "r.json"))
    assert r.exit_code == 2 and "folder" in r.output and "does not exist; create it first" in r.output
    assert not (blocker.parent / "a_file" / "sub").exists()
    r = run("robust", "--model", ckpt, "--norm", "linf", "--epsilons", "0,1/0", "--n", "5")
    assert r.exit_code == 2 and "fractions like 8/255 are fine" in r.output
    r = run("eval", "--model", ckpt, "--sigma", "nan")
    assert r.exit_code == 2 and "--sigma" in r.output
    for res in (r,):
        assert "Traceback" not in res.output


def test_robust_on_a_synthetic_set_takes_the_model_shape(digits_classifier_ckpt):
    r = run("robust", "--model", str(digits_classifier_ckpt), "--norm", "linf", "--data", "constant",
            "--epsilons", "0", "--n", "4", "--device", "cpu", "--json")
    # constant images are unlabelled: a one-line error, not a missing-input-shape complaint
    assert r.exit_code == 2 and "needs labelled data, and 'constant' is unlabelled" in r.output
    assert "input_shape" not in r.output and "Traceback" not in r.output


def test_core_errors_name_parameters_and_the_cli_shows_flags():
    import click

    from jemeval.cli import flag_message
    from jemeval.errors import UsageError

    @click.command()
    @click.option("--sgld-lr", type=float)
    @click.option("--lr", type=float)
    def command(sgld_lr, lr):
        pass

    assert flag_message(UsageError("lr must be > 0, got -1", param="lr"), command) == "--lr must be > 0, got -1"
    assert flag_message(UsageError("sgld_lr must be finite", param="sgld_lr"), command) == "--sgld-lr must be finite"
    assert flag_message(UsageError("the sgld_lrs are bad", param="lr"), command) == "the sgld_lrs are bad"  # words
    assert flag_message(UsageError("no parameter named"), command) == "no parameter named"


def test_plugins_lists_what_each_plugin_added_under_every_hook():
    r = run("plugins")
    assert r.exit_code == 0
    blocks = {block.split()[0]: block for block in re.split(r"\n(?=\S)", r.output)}
    assert "commands: calibrate, convert, distal" in blocks["jemeval.cli.default_commands"]
    layouts = blocks["jemeval.builtins.layouts"]
    assert "checkpoint_layouts: jem++/sada-jem, jem-release, jem-release-batchnorm" in layouts
    report = {p["name"]: p for p in json.loads(run("plugins", "--json").output)}
    assert report["jemeval.cli.default_commands"]["hooks"] == ["register_commands"]
    assert report["jemeval.builtins.layouts"]["hooks"] == ["register_checkpoint_layouts"]


def test_list_shows_every_kind_including_checkpoint_layouts():
    listing = json.loads(run("list", "--json").output)
    assert list(listing) == ["model", "dataset", "score", "metric", "attack", "checkpoint_layout", "logger"]
    assert {c["name"]: c["plugin"] for c in listing["checkpoint_layout"]}["jem-release"] == "jemeval.builtins.layouts"
