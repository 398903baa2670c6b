"""The plugin system: built-ins as plugins, test registration, isolation of broken plugins,
entry points (faked distributions and the real installed example plugin), the autoload switch,
hooks called with the arguments they name, and one test per hook (``test_hook_<name>``, checked by
:func:`test_every_hook_has_a_test`)."""
import ast
import functools
import json
import re
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import pluggy
import pytest
import torch
from click import argument as click_argument
from click import command as click_command
from click.testing import CliRunner

import jemeval
from jemeval import hookspecs, registry, testing
from jemeval.cli import cli
from jemeval.errors import UnknownNameError
from jemeval.plugins import DEFAULT_PLUGINS, PluginManager, call_hookimpl, get_plugin_manager

ROOT = Path(__file__).resolve().parents[1]


def _infos():
    return {i.name: i for i in get_plugin_manager().plugin_infos()}


def test_builtins_are_ordinary_plugins():
    infos = _infos()
    for name in DEFAULT_PLUGINS:
        assert infos[name].builtin and infos[name].version == jemeval.__version__
    assert "digits" in infos["jemeval.builtins.datasets"].registered["dataset"]
    assert {"logpx", "maxprob", "gradnorm"} <= set(jemeval.names("score"))
    assert {"train", "ood", "convert", "plugins"} <= set(infos["jemeval.cli.default_commands"].registered["command"])
    assert infos["jemeval.builtins.layouts"].registered["checkpoint_layout"] == [
        "jem-release", "jem-release-batchnorm", "jem++/sada-jem"]
    assert infos["jemeval.builtins.foolbox_attacks"].hooks == ["register_attacks"]


def test_kinds_are_derived_from_the_hookspecs(monkeypatch):
    assert registry.KINDS == ("model", "dataset", "score", "metric", "attack", "checkpoint_layout", "logger")
    assert registry.HOOKS["checkpoint_layout"] == "register_checkpoint_layouts"
    assert "command" not in registry.KINDS  # register_commands(cli) takes no `register`: not a kind

    @hookspecs.hookspec
    def register_widgets(register, context):
        """A hook that a later jemeval might add."""

    original = hookspecs.specs()
    monkeypatch.setattr(hookspecs, "specs", lambda: {**original, "register_widgets": register_widgets})
    assert list(registry._component_hooks()) == [*registry.KINDS, "widget"]


# -- hooks are called with the arguments they name ------------------------------------------------
def test_hookimpls_get_their_arguments_by_keyword():
    seen = []

    def spy(fn):
        @functools.wraps(fn)  # pluggy reads the wrapped function's argument names
        def wrapper(*args, **kwargs):
            seen.append((fn.__name__, args, sorted(kwargs)))
            return fn(*args, **kwargs)
        return wrapper

    def register_scores(register):
        register("spy-score", lambda model, x: model.log_px(x).detach())

    def register_models():  # takes none of its hook's arguments: still called
        seen.append(("no-argument model hook ran", (), []))

    plugin = types.SimpleNamespace(register_scores=jemeval.hookimpl(spy(register_scores)),
                                   register_models=jemeval.hookimpl(register_models))
    with testing.registered_plugin(plugin, name="spy"):
        assert "spy-score" in jemeval.names("score")
        assert ("register_scores", (), ["register"]) in seen
        assert ("no-argument model hook ran", (), []) in seen
        assert _infos()["spy"].as_dict()["error"] is None


def test_a_hook_gaining_an_argument_does_not_break_older_plugins():
    """The promise of hookspecs.py: a hook may gain arguments. A later register_scores(register,
    device) still calls a plugin written for register_scores(register), and one that names the new
    argument first, each with exactly what it names."""

    class LaterSpecs:
        @hookspecs.hookspec
        def register_scores(self, register, device):
            """register_scores as a later jemeval might define it."""

    class Old:
        @jemeval.hookimpl
        def register_scores(self, register):
            register("old", "registered")

    class New:
        @jemeval.hookimpl
        def register_scores(self, device, register):
            register("new", device)

    class Bare:
        @jemeval.hookimpl
        def register_scores(self):
            got["bare"] = "called"

    got = {}
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(LaterSpecs)
    for plugin in (Old(), New(), Bare()):
        pm.register(plugin)
    for impl in pm.hook.register_scores.get_hookimpls():
        call_hookimpl(impl, register=got.__setitem__, device="cuda:1")
    assert got == {"old": "registered", "new": "cuda:1", "bare": "called"}


def test_hook_register_scores():
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_scores(register):
        register("double-logpx", lambda model, x: 2 * model.log_px(x).detach(), help="twice log p")

    plugin.register_scores = register_scores
    with testing.registered_plugin(plugin, name="one-test", version="9.9"):
        assert "double-logpx" in jemeval.names("score")
        info = _infos()["one-test"]
        assert info.version == "9.9" and info.registered["score"] == ["double-logpx"]
        assert info.hooks == ["register_scores"]
        component = get_plugin_manager().registry.component("score", "double-logpx")
        assert component.plugin == "one-test" and component.help == "twice log p"
        model = testing.tiny_model()
        x = torch.rand(5, *model.input_shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
        assert torch.allclose(jemeval.get("score", "double-logpx")(model, x), 2 * model(x).logsumexp(1).detach())
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
        with pytest.raises(UnknownNameError,
                           match="plugin 'raiser' failed to load: register_models raised RuntimeError: boom"):
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
    out = subprocess.run([sys.executable, "-m", "jemeval", "plugins", "--json"], capture_output=True, text=True,
                         check=True)
    report = {p["name"]: p for p in json.loads(out.stdout)}
    ex = report["example"]
    assert ex["version"] == "0.1.0" and ex["distribution"] == "jemeval-example" and ex["error"] is None
    assert ex["registered"] == {"attack": ["example-noise"], "dataset": ["example-stripes"],
                                "metric": ["example-detection-error"], "model": ["example-mlp"],
                                "score": ["example-centroid", "example-l2"], "command": ["example-count"]}
    assert "register_commands" in ex["hooks"]


def test_example_plugin_components_pass_the_contract_checks():
    testing.check_model("example-mlp", num_classes=2, input_shape=(1, 8, 8))
    ds = testing.check_dataset("example-stripes")
    assert ds.num_classes == 2
    testing.check_score("example-l2")
    testing.check_detector("example-centroid")
    assert testing.check_metric("example-detection-error") >= 0
    testing.check_attack("example-noise", norm="linf")
    testing.check_attack("example-noise", norm="l2")


def test_example_plugin_command():
    r = CliRunner().invoke(cli, ["example-count", "example-stripes", "--split", "train"])
    assert r.exit_code == 0 and r.output.splitlines() == ["class 0: 100", "class 1: 100"], r.output
    r = CliRunner().invoke(cli, ["example-count", "example-stripe"])
    assert r.exit_code == 2 and "did you mean 'example-stripes'" in r.output and "Traceback" not in r.output


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


# -- one test per hook -------------------------------------------------------------------------------
def _plugin(**hooks):
    return types.SimpleNamespace(**{name: jemeval.hookimpl(fn) for name, fn in hooks.items()})


def test_hook_register_models():
    def plugin_mlp(num_classes, input_shape, *, hidden: int = 32):
        """The test kit's TinyNet."""
        return testing.TinyNet(num_classes, input_shape, hidden=hidden)

    with testing.registered_plugin(_plugin(register_models=lambda register: register("plugin-mlp", plugin_mlp)),
                                   name="models-plugin"):
        model = jemeval.create_model("plugin-mlp:hidden=8", 3, (1, 4, 4))
        assert model.arch == "plugin-mlp" and model.arch_options == {"hidden": 8}
        assert model.net.body[1].out_features == 8 and model(torch.zeros(2, 1, 4, 4)).shape == (2, 3)
        assert get_plugin_manager().registry.component("model", "plugin-mlp").plugin == "models-plugin"
        testing.check_model("plugin-mlp", num_classes=3, input_shape=(1, 4, 4))


def test_hook_register_datasets():
    def plugin_set(split, root, download, *, n: int = 12):
        """Twelve images of class split == 'test'."""
        return testing.tiny_dataset(n=n, num_classes=2, seed=0 if split == "train" else 1)

    with testing.registered_plugin(_plugin(register_datasets=lambda register: register("plugin-set", plugin_set)),
                                   name="datasets-plugin"):
        ds = jemeval.load_dataset("plugin-set:n=6", "train")
        assert len(ds) == 6 and ds.num_classes == 2
        assert torch.equal(ds.x, testing.tiny_dataset(n=6, num_classes=2, seed=0).x)
        testing.check_dataset("plugin-set")


def test_hook_register_metrics():
    from jemeval.evaluation.metrics import registered_metrics, select_metrics

    @jemeval.ood_metric
    def mean_gap(id_scores, ood_scores):
        """Mean ID score minus mean OOD score."""
        return float(np.mean(id_scores) - np.mean(ood_scores))

    with testing.registered_plugin(_plugin(register_metrics=lambda register: register("mean-gap", mean_gap)),
                                   name="metrics-plugin"):
        assert [name for name, _ in registered_metrics("ood")][-1] == "mean-gap"  # after the built-ins
        assert "mean-gap" not in dict(select_metrics("ood"))  # opt-in: no default output changes
        (name, metric), = select_metrics("ood", ["mean-gap"])
        assert metric([3.0, 5.0], [1.0, 2.0, 3.0]) == 2.0
        assert testing.check_metric("mean-gap") == pytest.approx(1.0, abs=0.5)


def test_hook_register_attacks():
    def nudge(norm, *, size: float = 1.0):
        """Moves every pixel by size * epsilon (Linf) towards -1."""
        def attack(model, x, y, epsilons):
            return torch.stack([(x - 2 * float(size) * e).clamp(-1, 1) for e in epsilons])
        attack.norms = ("linf",)
        return attack

    with testing.registered_plugin(_plugin(register_attacks=lambda register: register("nudge", nudge)),
                                   name="attacks-plugin"):
        advs = testing.check_attack("nudge", norm="linf", epsilons=(0.0, 0.1))
        assert torch.equal(advs[0], advs[0].clamp(-1, 1)) and (advs[1] <= advs[0]).all()
        with pytest.raises(AssertionError, match="exceeds epsilon"):
            testing.check_attack("nudge", norm="linf", size=2.0)


def test_hook_register_commands(monkeypatch):
    lazy = types.ModuleType("jemeval_test_lazy_commands")

    @click_command("lazy-hello")
    def lazy_hello():
        """Say hello from a lazily imported module."""
        print("hello from a lazy command")

    lazy.hello = lazy_hello
    monkeypatch.setitem(sys.modules, lazy.__name__, lazy)

    def register_commands(cli):
        @cli.command("plugin-add")
        @click_argument("a", type=int)
        @click_argument("b", type=int)
        def add(a, b):
            """Add two numbers."""
            print(a + b)

        cli.add_lazy_command("lazy-hello", f"{lazy.__name__}:hello")

    with testing.registered_plugin(_plugin(register_commands=register_commands), name="commands-plugin"):
        runner = CliRunner()
        listing = runner.invoke(cli, ["--help"])
        assert listing.exit_code == 0 and "plugin-add" in listing.output and "lazy-hello" in listing.output
        assert runner.invoke(cli, ["plugin-add", "2", "3"]).output == "5\n"
        assert runner.invoke(cli, ["lazy-hello"]).output == "hello from a lazy command\n"
        info = _infos()["commands-plugin"]
        assert info.registered["command"] == ["plugin-add", "lazy-hello"] and info.hooks == ["register_commands"]
        assert "plugin-add" in runner.invoke(cli, ["plugins"]).output
    assert "plugin-add" not in CliRunner().invoke(cli, ["--help"]).output


def test_broken_command_plugins_do_not_break_help_or_built_in_commands():
    def register_commands(cli):
        @cli.command("train")
        def fake_train():
            """Would shadow jemeval train."""

        cli.add_lazy_command("missing-module", "no_such_module_for_jemeval:cli")

    def raising(cli):
        raise RuntimeError("command hook bug")

    with testing.registered_plugin(_plugin(register_commands=register_commands), name="shadow"), \
            testing.registered_plugin(_plugin(register_commands=raising), name="raiser"):
        runner = CliRunner()
        listing = runner.invoke(cli, ["--help"])
        assert listing.exit_code == 0 and "(failed to load)" in listing.output
        assert "jemeval: warning: plugin 'raiser': register_commands raised RuntimeError" in listing.stderr
        assert "Train a JEM" in runner.invoke(cli, ["train", "--help"]).output  # the built-in, not the shadow
        r = runner.invoke(cli, ["missing-module", "--any-flag"])
        assert r.exit_code == 1 and "plugin 'shadow' failed to load: ModuleNotFoundError" in r.output
        report = {p["name"]: p for p in json.loads(runner.invoke(cli, ["plugins", "--json"]).output)}
        assert "command 'train' is added twice: by plugin 'jemeval.cli.default_commands' and by plugin 'shadow'" \
            in report["shadow"]["error"]
        assert report["raiser"]["error"] == "register_commands raised RuntimeError: command hook bug"


def test_help_imports_no_component_builtins():
    """`jemeval --help` runs the command hook of the built-in command plugin and the installed
    plugins only: the component built-ins (which import torch) stay unloaded."""
    code = ("import sys; from jemeval.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('jemeval.builtins')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]" and "train" in out.stdout


# -- meta-tests: every hook documented and tested ------------------------------------------------------
def test_every_hookspec_is_documented_with_its_signature():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    documented = re.findall(r"^### `(register_\w+\([^)]*\))`", doc, flags=re.MULTILINE)
    assert sorted(documented) == sorted(hookspecs.signature(name) for name in hookspecs.specs())


def test_every_hook_has_a_test():
    tests = {node.name for path in (ROOT / "tests").glob("test_*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
    assert [name for name in hookspecs.specs() if f"test_hook_{name}" not in tests] == []


def test_provenance_records_every_plugin_version():
    from jemeval.provenance import provenance

    with testing.registered_plugin(types.SimpleNamespace(), name="versioned", version="2.1"):
        plugins = provenance(command="test")["plugins"]
    assert plugins["versioned"] == "2.1" and plugins["example"] == "0.1.0" and plugins["jemeval"] == jemeval.__version__
    assert not any(name.startswith("jemeval.") for name in plugins)  # built-ins are jemeval's version


def test_the_python_api_never_imports_the_command_line():
    code = ("import sys, jemeval; jemeval.names('score'); jemeval.get('checkpoint_layout', 'jem-release')\n"
            "print(sorted(m for m in sys.modules if m.startswith('jemeval.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
