import json

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


def test_bad_component_options_are_one_line_usage_errors(digits_classifier_ckpt):
    r = run("ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--score", "energy:t=3")
    assert r.exit_code == 2 and "score 'energy' has no option 't' (did you mean 'T'?); its options: T" in r.output
    r = run("robust", "--model", str(digits_classifier_ckpt), "--norm", "l2", "--attack", "pgd:bogus=1", "--n", "5")
    assert r.exit_code == 2 and "attack 'pgd' has no option 'bogus'" in r.output
    assert "Traceback" not in r.output
