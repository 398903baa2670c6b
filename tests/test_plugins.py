"""The plugin system: built-ins as plugins, test registration, isolation of broken plugins,
entry points (faked distributions and the real installed example plugin), the autoload switch."""
import subprocess
import sys
import types
from importlib import metadata

import pytest

import jemeval
from jemeval import testing
from jemeval.errors import UnknownNameError
from jemeval.plugins import DEFAULT_PLUGINS, PluginManager, get_plugin_manager


def test_builtins_are_ordinary_plugins():
    infos = {i.name: i for i in get_plugin_manager().plugin_infos()}
    for name in DEFAULT_PLUGINS:
        assert infos[name].builtin and infos[name].version == jemeval.__version__
    assert "digits" in infos["jemeval.builtins.datasets"].registered["dataset"]
    assert {"logpx", "maxprob", "gradnorm"} <= set(jemeval.names("score"))


def test_register_plugin_object_for_one_test():
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_scores(register):
        register("double-logpx", lambda model, x: 2 * model.log_px(x).detach(), help="twice log p")

    plugin.register_scores = register_scores
    with testing.registered_plugin(plugin, name="one-test", version="9.9"):
        assert "double-logpx" in jemeval.names("score")
        info = {i.name: i for i in get_plugin_manager().plugin_infos()}["one-test"]
        assert info.version == "9.9" and info.registered["score"] == ["double-logpx"]
        testing.check_score("double-logpx")
    assert "double-logpx" not in jemeval.names("score")


def test_duplicate_from_plugin_is_isolated_and_reported(capsys):
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_scores(register):
        register("logpx", lambda m, x: m.log_px(x))

    plugin.register_scores = register_scores
    with testing.registered_plugin(plugin, name="dup"):
        info = {i.name: i for i in get_plugin_manager().plugin_infos()}["dup"]
        assert "registered twice" in info.as_dict()["error"]
        assert jemeval.get("score", "logpx").__module__ == "jemeval.builtins.scores"
    assert "plugin 'dup'" in capsys.readouterr().err


def test_hook_that_raises_does_not_break_others():
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_models(register):
        raise RuntimeError("boom")

    plugin.register_models = register_models
    with testing.registered_plugin(plugin, name="raiser"):
        assert "wrn" in jemeval.names("model")
        with pytest.raises(UnknownNameError, match="plugin 'raiser' failed to load: register_models raised RuntimeError: boom"):
            jemeval.get("model", "raiser-model")


def test_misspelt_hook_is_reported():
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_scroes(register):  # misspelt on purpose
        pass

    plugin.register_scroes = register_scroes
    with testing.registered_plugin(plugin, name="typo"):
        info = {i.name: i for i in get_plugin_manager().plugin_infos()}["typo"]
        assert "register_scroes" in info.as_dict()["error"]


class _FakeDist:
    def __init__(self, name, version):
        self.name, self.version = name, version


def _fake_entry_points(monkeypatch, eps):
    def entry_points(group=None):
        assert group == "jemeval"
        return eps

    monkeypatch.setattr(metadata, "entry_points", entry_points)


def test_broken_entry_point_is_isolated(monkeypatch, capsys):
    good = metadata.EntryPoint("good", "jemeval_example.plugin", "jemeval")
    broken = metadata.EntryPoint("broken", "no_such_module_for_jemeval", "jemeval")
    for ep, dist in ((good, _FakeDist("jemeval-example", "0.1.0")), (broken, _FakeDist("broken-dist", "1.2"))):
        object.__setattr__(ep, "dist", dist)
    _fake_entry_points(monkeypatch, [good, broken])
    pm = PluginManager()
    infos = {i.name: i.as_dict() for i in pm.plugin_infos()}
    assert infos["broken"]["version"] == "1.2" and "import failed: ModuleNotFoundError" in infos["broken"]["error"]
    assert infos["good"]["registered"]["model"] == ["example-mlp"]
    assert "wrn" in pm.registry.names("model")
    assert "plugin 'broken'" in capsys.readouterr().err


def test_autoload_can_be_disabled(monkeypatch):
    ep = metadata.EntryPoint("good", "jemeval_example.plugin", "jemeval")
    _fake_entry_points(monkeypatch, [ep])
    monkeypatch.setenv("JEMEVAL_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = PluginManager()
    assert [i.name for i in pm.plugin_infos()] == sorted(DEFAULT_PLUGINS)
    assert "example-mlp" not in pm.registry.names("model")


def test_example_plugin_installed_through_real_entry_point():
    """CI installs plugins/jemeval-example; it must be found through importlib metadata."""
    eps = [ep for ep in metadata.entry_points(group="jemeval") if ep.name == "example"]
    assert eps, "plugins/jemeval-example is not installed (pip install plugins/jemeval-example)"
    out = subprocess.run([sys.executable, "-m", "jemeval", "plugins", "--json"], capture_output=True, text=True, check=True)
    import json

    report = {p["name"]: p for p in json.loads(out.stdout)}
    ex = report["example"]
    assert ex["version"] == "0.1.0" and ex["distribution"] == "jemeval-example" and ex["error"] is None
    assert ex["registered"] == {"attack": ["example-noise"], "dataset": ["example-stripes"], "metric": ["example-detection-error"],
                                "model": ["example-mlp"], "score": ["example-l2"]}


def test_example_plugin_components_pass_the_contract_checks():
    testing.check_model("example-mlp", num_classes=2, input_shape=(1, 8, 8))
    ds = testing.check_dataset("example-stripes")
    assert ds.num_classes == 2
    testing.check_score("example-l2")
    assert testing.check_metric("example-detection-error") >= 0
    testing.check_attack("example-noise", norm="linf")
    testing.check_attack("example-noise", norm="l2")


def test_registering_an_already_registered_module_is_a_clear_error():
    from jemeval.builtins import scores
    from jemeval.errors import PluginError

    with pytest.raises(PluginError, match="already registered as 'jemeval.builtins.scores'"):
        with testing.registered_plugin(scores, name="again"):
            pass


def test_component_options_are_checked_against_signatures():
    from jemeval.errors import UsageError
    from jemeval.registry import check_options

    energy = jemeval.get("score", "energy")
    check_options(energy, {"T": 2}, "score 'energy'", skip=2)
    with pytest.raises(UsageError, match=r"score 'energy' has no option 't' \(did you mean 'T'\?\); its options: T"):
        check_options(energy, {"t": 2}, "score 'energy'", skip=2)


def test_crash_inside_a_component_is_one_line_unless_debugging(monkeypatch):
    from click.testing import CliRunner

    from jemeval.cli import cli

    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_datasets(register):
        def crashing(split, root, download):
            raise ZeroDivisionError("plugin bug")
        register("crashing", crashing)

    plugin.register_datasets = register_datasets

    @cli.command("load-crashing", hidden=True)
    def load_crashing():
        jemeval.load_dataset("crashing")

    try:
        with testing.registered_plugin(plugin, name="crasher"):
            r = CliRunner().invoke(cli, ["load-crashing"])
            assert r.exit_code == 1
            assert "unexpected ZeroDivisionError: plugin bug" in r.output and "JEMEVAL_DEBUG=1" in r.output
            assert "Traceback" not in r.output
            monkeypatch.setenv("JEMEVAL_DEBUG", "1")
            r = CliRunner().invoke(cli, ["load-crashing"])
            assert isinstance(r.exception, ZeroDivisionError)
    finally:
        cli.commands.pop("load-crashing", None)
