"""``--config FILE`` (YAML / TOML) on train, ood, robust and report, and ``jemeval train --print-config``."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from click.testing import CliRunner

from jemeval.cli import cli
from jemeval.formats.native import read_checkpoint
from jemeval.training.config import resolve_config


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line(result) -> str:
    text = result.output.strip()
    assert "\n" not in text and "Traceback" not in text, text
    return text


FLAGS = ["--epochs", "1", "--sgld-steps", "2", "--buffer-size", "100", "--batch-size", "64", "--seed", "3",
         "--decay-epochs", "1", "--sigma", "0.05", "--bf16", "--no-progress", "--device", "cpu"]
YAML = """\
dataset: digits
epochs: 1
sgld_steps: 2          # '_' and '-' both work
buffer-size: 100
batch-size: 64
seed: 3
decay-epochs: [1]      # a list is a comma list
sigma: 0.05
bf16: true
no-progress: true
device: cpu
labels-per-class: null # null: not set
"""


def test_digits_run_from_config_equals_the_run_from_flags(tmp_path):
    (tmp_path / "c.yaml").write_text(YAML)
    flags = invoke("train", "digits", *FLAGS, "--out", tmp_path / "flags", "--json")
    from_file = invoke("train", "--config", tmp_path / "c.yaml", "--out", tmp_path / "file", "--json")
    assert flags.exit_code == 0 and from_file.exit_code == 0, flags.output + from_file.output
    for name in ("best.pt", "last.pt"):
        a, b = read_checkpoint(tmp_path / "flags" / name), read_checkpoint(tmp_path / "file" / name)
        assert a["state_dict"].keys() == b["state_dict"].keys()
        assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])  # last.pt: the chains too
    ca, cb = a["config"], b["config"]
    assert {k: v for k, v in ca.items() if k not in ("out", "config_file")} == \
           {k: v for k, v in cb.items() if k not in ("out", "config_file")}
    # the file is recorded with the run: in last.pt, best.pt and the summary
    digest = hashlib.sha256((tmp_path / "c.yaml").read_bytes()).hexdigest()
    assert cb["config_file"]["sha256"] == digest and ca["config_file"] is None
    assert "sgld-steps" in cb["config_file"]["keys"] and "labels-per-class" not in cb["config_file"]["keys"]
    assert json.loads(from_file.stdout)["config"]["config_file"]["file"] == str(tmp_path / "c.yaml")


def print_config(*args):
    result = invoke("train", "--print-config", *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_toml_yaml_and_flags_give_the_same_settings(tmp_path):
    (tmp_path / "c.yaml").write_text(YAML)
    (tmp_path / "c.toml").write_text(
        'dataset = "digits"\nepochs = 1\nsgld_steps = 2\nbuffer-size = 100\nbatch-size = 64\nseed = 3\n'
        'decay-epochs = [1]\nsigma = 0.05\nbf16 = true\nno-progress = true\ndevice = "cpu"\n')
    from_flags = print_config("digits", *FLAGS)
    assert print_config("--config", tmp_path / "c.yaml") == from_flags
    assert print_config("--config", tmp_path / "c.toml") == from_flags
    assert "\nsgld-steps: 2\n" in from_flags and "\ndecay-epochs: [1]\n" in from_flags


def test_command_line_overrides_the_file(tmp_path):
    (tmp_path / "c.yaml").write_text(YAML)
    text = print_config("--config", tmp_path / "c.yaml", "--epochs", "7", "--sgld-lr", "0.5")
    assert "\nepochs: 7\n" in text and "\nsgld-lr: 0.5\n" in text and "\nsgld-steps: 2\n" in text
    # the DATASET argument too
    assert "\ndataset: digits[0-4]\n" in print_config("digits[0-4]", "--config", tmp_path / "c.yaml")


@pytest.mark.parametrize("dataset", ["digits", "cifar10"])
def test_print_config_is_a_complete_file_of_the_dataset_defaults(tmp_path, dataset):
    text = print_config(dataset)
    (tmp_path / "c.yaml").write_text(text)
    assert print_config("--config", tmp_path / "c.yaml") == text  # reading it back changes nothing
    import yaml

    from jemeval.cli.commands.train import cli as train_command
    from jemeval.cli.config import canonical_keys

    keys = yaml.safe_load(text)
    every = set(canonical_keys(train_command).values())
    assert set(keys) == every and {"dataset", "sgld-lr", "compile", "data-root", "nproc"} <= every
    assert not {"config", "print-config", "help"} & every
    expected = resolve_config(dataset)
    assert keys["dataset"] == dataset and keys["arch"] == expected.arch and keys["epochs"] == expected.epochs
    assert keys["lr"] == expected.lr and keys["decay-epochs"] == list(expected.decay_epochs)
    assert keys["val-size"] == expected.val_size and keys["buffer-size"] == expected.buffer_size


def test_print_config_defaults_to_digits_and_training_needs_a_dataset(tmp_path):
    assert "\ndataset: digits\n" in print_config()
    r = invoke("train", "--epochs", "1")
    assert r.exit_code == 2 and "Missing argument 'DATASET'" in one_line(r)


@pytest.mark.parametrize("name, text, words", [
    ("c.yaml", "dataset: digits\nsgld-step: 2\n", "train has no option 'sgld-step' (did you mean 'sgld-steps'"),
    ("c.yaml", "dataset: digits\nepochs: [1\n", "is not valid YAML"),
    ("c.toml", "epochs = \n", "is not valid TOML"),
    ("c.yaml", "- digits\n", "must hold a mapping of option names to values, not a list"),
    ("c.yaml", "augment: no\n", "augment is false, not a value of this option (YAML reads yes/no/on/off"),
    ("c.yaml", "epochs: 1.5\n", "epochs must be a whole number, got 1.5"),
    ("c.yaml", "epochs: {a: 1}\n", "epochs is a mapping"),
    ("c.ini", "epochs = 1\n", "unknown file type '.ini'"),
    ("c.yaml", "epochs: many\n", "Invalid value for '--epochs': 'many' is not a valid integer"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    r = invoke("train", "digits", "--config", tmp_path / name, "--print-config")
    assert r.exit_code == 2 and words in one_line(r)
    assert str(tmp_path / name) in r.output or "Invalid value" in r.output


def test_one_file_with_sections_serves_several_commands(tmp_path, digits_classifier_ckpt):
    (tmp_path / "all.yaml").write_text(f"""\
device: cpu
seed: 1
train:
  dataset: digits
  epochs: 3
ood:
  model: {digits_classifier_ckpt}
  ood: [uniform, constant]
  score: logpx
  n: 60
robust:
  norm: l2
""")
    text = print_config("--config", tmp_path / "all.yaml")
    assert "\nepochs: 3\n" in text and "\nseed: 1\n" in text and "\ndevice: cpu\n" in text
    r = invoke("ood", "--config", tmp_path / "all.yaml", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [(x["ood"], x["n_id"]) for x in data["records"]] == [("uniform", 60), ("constant", 60)]
    config = data["provenance"]["config"]
    assert config["file"] == str(tmp_path / "all.yaml") and config["keys"] == ["device", "model", "n", "ood", "score",
                                                                              "seed"]
    assert config["options"]["score"] == "logpx" and config["options"]["n"] == 60 and config["options"]["json"]
    assert config["sha256"] == hashlib.sha256((tmp_path / "all.yaml").read_bytes()).hexdigest()


def test_robust_reads_its_options_from_a_config(tmp_path, digits_classifier_ckpt):
    (tmp_path / "r.yaml").write_text(f"model: {digits_classifier_ckpt}\nnorm: l2\nepsilons: [0, 0.5]\nn: 8\n"
                                     "steps: 2\ndevice: cpu\nbatch-size: 8\n")
    r = invoke("robust", "--config", tmp_path / "r.yaml", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [x["epsilon"] for x in data["records"]] == [0.0, 0.5] and data["records"][0]["n"] == 8
    assert data["provenance"]["config"]["options"]["epsilons"] == "0,0.5"
    (tmp_path / "bad.yaml").write_text("grad_mod: bpda\n")
    r = invoke("robust", "--config", tmp_path / "bad.yaml")
    assert r.exit_code == 2 and "robust has no option 'grad_mod' (did you mean 'grad-mode'" in one_line(r)


def test_without_config_nothing_is_added_to_provenance(digits_classifier_ckpt):
    r = invoke("ood", "--model", digits_classifier_ckpt, "--ood", "uniform", "--score", "logpx", "--n", "30",
               "--device", "cpu", "--json")
    assert r.exit_code == 0 and "config" not in json.loads(r.stdout)["provenance"]


def test_report_reads_its_options_from_a_config(tmp_path, digits_classifier_ckpt):
    """report takes the same --config: the file's values run, the command line wins, report.json records it."""
    (tmp_path / "rep.yaml").write_text(f"model: [{digits_classifier_ckpt}]\nsections: accuracy\nn: 20\nseed: 4\n"
                                       "device: cpu\nreport:\n  n: 16\n")
    r = invoke("report", "--config", tmp_path / "rep.yaml", "--out", tmp_path / "r", "--seed", "5", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {rec["section"] for rec in data["records"]} == {"accuracy"} and {rec["n"] for rec in data["records"]} == {16}
    config = data["provenance"]["config"]
    assert config["keys"] == ["device", "model", "n", "sections", "seed"] and config["options"]["seed"] == 5
    r = invoke("report", "--config", tmp_path / "rep.yaml", "--sectons", "ood")
    assert r.exit_code == 2 and "did you mean" in one_line(r).lower()
    (tmp_path / "bad.yaml").write_text("sectons: ood\n")
    r = invoke("report", "--config", tmp_path / "bad.yaml")
    assert r.exit_code == 2 and "report has no option 'sectons' (did you mean 'sections'" in one_line(r)
