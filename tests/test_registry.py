import pytest

from jemeval.errors import DuplicateNameError, UnknownNameError, UsageError
from jemeval.registry import Registry, parse_spec


def _f(*a, **k):
    return None


def test_duplicate_names_are_errors_naming_both_plugins():
    r = Registry()
    r.add("score", "logpx", _f, plugin="a")
    with pytest.raises(DuplicateNameError, match=r"'logpx' is registered twice: by plugin 'a' and by plugin 'b'"):
        r.add("score", "logpx", _f, plugin="b")


def test_unknown_name_suggests_close_matches_and_lists_known():
    r = Registry()
    r.add("score", "logpx", _f, plugin="a")
    r.add("score", "maxprob", _f, plugin="a")
    with pytest.raises(UnknownNameError) as exc:
        r.get("score", "logp")
    assert "did you mean 'logpx'?" in str(exc.value)
    assert "known scores: logpx, maxprob" in str(exc.value)


def test_unknown_name_mentions_broken_plugins():
    r = Registry()
    r.failures.append(("broken-plugin", "import failed: ImportError: nope"))
    with pytest.raises(UnknownNameError, match="plugin 'broken-plugin' failed to load"):
        r.get("model", "whatever")


def test_glob_listing_and_invalid_names():
    r = Registry()
    for n in ("wrn", "wrn-bn", "cnn"):
        r.add("model", n, _f, plugin="p")
    assert r.names("model", "wrn*") == ["wrn", "wrn-bn"]
    assert r.names("model") == ["cnn", "wrn", "wrn-bn"]
    with pytest.raises(UsageError, match="invalid name"):
        r.add("model", "has space", _f, plugin="p")
    with pytest.raises(UsageError, match="not a callable"):
        r.add("model", "x", 3, plugin="p")
    with pytest.raises(UsageError, match="unknown component kind"):
        r.names("modle")


@pytest.mark.parametrize("text,name,variant,options,classes", [
    ("digits", "digits", None, {}, None),
    ("timm:resnet18", "timm", "resnet18", {}, None),
    ("energy:T=2", "energy", None, {"T": 2}, None),
    ("wrn:depth=16,widen=4,norm=batch", "wrn", None, {"depth": 16, "widen": 4, "norm": "batch"}, None),
    ("digits[0-4]", "digits", None, {}, (0, 1, 2, 3, 4)),
    ("cifar10[1,3]", "cifar10", None, {}, (1, 3)),
    ("interp:digits[5-9]", "interp", "digits", {}, (5, 6, 7, 8, 9)),
    ("npz:/tmp/a,b.npz", "npz", "/tmp/a,b.npz", {}, None),
])
def test_parse_spec(text, name, variant, options, classes):
    spec = parse_spec(text)
    assert (spec.name, spec.variant, spec.options, spec.classes) == (name, variant, options, classes)


def test_parse_spec_bad_class_list():
    with pytest.raises(UsageError, match="bad class list"):
        parse_spec("digits[a-b]")


def test_python_api_takes_plural_kinds_like_the_cli():
    """Issue 11 item 14: `jemeval list models` works, so jemeval.get("models", ...) must too."""
    import jemeval

    assert jemeval.get("models", "cnn") is jemeval.get("model", "cnn")
    assert jemeval.names("scores") == jemeval.names("score") and "logpx" in jemeval.names("Scores")
    with pytest.raises(UsageError, match=r"unknown component kind 'modles' \(did you mean 'model'\?\)"):
        jemeval.names("modles")


@pytest.mark.parametrize("spec, message", [
    ("cnn:widht=8", "model 'cnn' has no option 'widht' (did you mean 'width'?); its options: width, stride"),
    ("wrn:widn=4",
     "model 'wrn' has no option 'widn' (did you mean 'widen'?); its options: depth, widen, norm, dropout"),
    ("cnn:big", "model 'cnn' takes no ':big' variant, only key=value options (width, stride), e.g. cnn:width=..."),
])
def test_model_options_are_checked_against_the_factory(spec, message):
    """Issue 11 item 14: `--arch cnn:widht=8` gave a TypeError text with neither the valid options nor a suggestion."""
    import jemeval

    with pytest.raises(UsageError) as exc:
        jemeval.create_model(spec, 10, (1, 8, 8))
    assert str(exc.value) == message


@pytest.mark.any_device
def test_cli_arch_typo_lists_the_options(tmp_path):
    from click.testing import CliRunner

    from jemeval.cli import cli

    r = CliRunner().invoke(cli, ["train", "digits", "--arch", "cnn:widht=8", "--epochs", "1",
                                 "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "did you mean 'width'?" in r.output and "its options: width" in r.output, r.output
    assert not (tmp_path / "r" / "best.pt").exists()


def test_split_specs_keeps_a_single_name_whole():
    from jemeval.registry import split_specs

    assert split_specs("uniform", "ood") == ["uniform"]
    assert split_specs("uniform, digits[0,1],interp", "ood") == ["uniform", "digits[0,1]", "interp"]
    assert split_specs(("uniform", " interp "), "ood") == ["uniform", "interp"]
    with pytest.raises(UsageError, match="ood is empty"):
        split_specs(" , ", "ood")


def test_checkpoint_layouts_keep_their_authors_names_and_must_match_something():
    from jemeval.formats.foreign import CheckpointLayout
    from jemeval.registry import normalize_kind

    r = Registry()
    layout = CheckpointLayout("a layout", match=lambda obj: None)
    assert r.add("checkpoint-layouts", "jem++/sada-jem", layout, plugin="p").help == "a layout"
    with pytest.raises(UsageError, match=r"invalid name 'a\+b'.*letters, digits, '_', '.', '-', and start"):
        r.add("model", "a+b", _f, plugin="p")  # '+' and '/' only for layouts, which nobody types in a spec
    with pytest.raises(UsageError, match="not an object with match"):
        r.add("checkpoint_layout", "nothing", _f, plugin="p")
    assert normalize_kind("Checkpoint-Layouts") == "checkpoint_layout"
