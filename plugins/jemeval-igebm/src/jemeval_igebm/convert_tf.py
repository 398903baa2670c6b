"""Convert checkpoints of the IGEBM TensorFlow release (openai/ebm_code_release) to jemeval's format.

Usage: ``jemeval convert cachedir/cifar10_cond/model_74700 igebm_cifar10.pt --dataset cifar10``
(IN is a TF1 checkpoint prefix, its ``.index`` file, or a folder holding a ``checkpoint`` file): the
plugin registers the layout ``igebm-tf-release`` (:data:`LAYOUT`, through
``register_checkpoint_layouts``), which recognises such paths (:func:`match_tf_checkpoint`). The
plugin's older console script, ``jemeval-igebm-convert IN OUT``, runs the same code.
Only :func:`read_tf_variables` imports TensorFlow (``pip install 'jemeval-igebm[tf]'``); the
mapping itself (:func:`release_to_state_dict`) works on a plain ``{name: numpy array}`` dict.

The release builds its networks under the scope ``context_0``. Variable names mapped (``<b>`` is a
residual block: res_optim, res_1, ...; weights stored as TF's (kh, kw, in, out)):

=====================================================  ===========================================
``context_0/c1_pre/cweight``, ``c_u``                  ``stem.weight`` (to out, in, kh, kw), ``stem.u``
``context_0/<b>_res_c1/cweight``, ``c_u``, ``gb``      ``blocks.i.conv1.weight``, ``.u``, ``blocks.i.bias1``
``context_0/<b>_res_c2/cweight``, ``c_u``              ``blocks.i.conv2.weight``, ``.u``
``context_0/<b>_res_c2/gb``, ``g``, ``cb``             ``blocks.i.bias2``, ``gain2``, ``gain_offset2``
``context_0/<b>_res_adaptive/cweight``, ``c_u``        ``blocks.i.shortcut.weight``, ``.u``
``context_0/fc5/wweight``, ``b``                       ``energy_head.weight`` (transposed), ``.bias``
=====================================================  ===========================================

Known names the release creates but its forward pass never reads are ignored: every conv's
``b`` (its ``conv_block`` drops the bias), ``c1_pre``'s ``g``/``gb``/``cb``, ``res_c1``'s ``g``/``cb``,
``res_adaptive``'s ``g``/``gb``/``cb``, ``fc_dense/*`` (created by ResNet32, never used),
``atten/*`` while ``atten/gamma`` is 0 (attention off), and optimizer state (``*/Adam``,
``*/Adam_1``, ``beta1_power``, ``beta2_power``). Any other name is an error that lists it.
Unconditional checkpoints (1-D ``g``/``gb``) become a one-class model.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

SCOPE = "context_0"
#: residual block names of the release's networks, in forward order
BLOCK_NAMES: dict[str, list[str]] = {
    "resnet32": ["res_optim"] + [f"res_{i}" for i in range(1, 6)],
    "large": ["res_optim"] + [f"res_{i}" for i in range(1, 9)],
    "wider": ["res_optim"] + [f"res_{i}" for i in range(1, 9)],
    "larger": ["res_optim", "res_1", "res_2", "res_2a", "res_2b", "res_3", "res_4", "res_5", "res_5a", "res_5b",
               "res_6", "res_7", "res_8", "res_8a", "res_8b"],
}
_UNUSED_FIELDS = {"c1_pre": {"b", "g", "gb", "cb"}, "res_c1": {"b", "g", "cb"}, "res_c2": {"b"},
                  "res_adaptive": {"b", "g", "gb", "cb"}}
_OPTIMIZER = re.compile(r"(^|/)(Adam(_\d+)?|beta1_power|beta2_power|global_step)($|/)")


def _conv(w: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.transpose(w, (3, 2, 0, 1)))).float()


def _vec(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32).reshape(-1).copy())


def _rows(a: np.ndarray) -> torch.Tensor:
    """Per-class parameters as (K, C): the unconditional release stores them as (C,)."""
    a = np.asarray(a, dtype=np.float32)
    return torch.from_numpy((a[None] if a.ndim == 1 else a).copy())


def identify_variant(variables: Mapping[str, np.ndarray]) -> str:
    """Which release network (resnet32, large, larger, wider) the block names describe."""
    from jemeval.errors import CheckpointError

    found = {m.group(1) for k in variables if (m := re.match(rf"^{SCOPE}/(res_\w+?)_res_c1/cweight$", k))}
    if not found:
        raise CheckpointError(f"no IGEBM residual blocks ({SCOPE}/res_*_res_c1/cweight) in the checkpoint; "
                              "expected a checkpoint of the release's ResNet32 family")
    stem = variables[f"{SCOPE}/c1_pre/cweight"].shape[-1]
    first = variables[f"{SCOPE}/res_optim_res_c1/cweight"].shape[-1]
    for variant in ("larger", "wider" if stem != first else "large", "resnet32"):
        if found == set(BLOCK_NAMES[variant]):
            return variant
    raise CheckpointError(f"IGEBM blocks {sorted(found)} match none of the release's networks "
                          f"({', '.join(f'{k}: {len(v)} blocks' for k, v in BLOCK_NAMES.items())})")


def release_to_state_dict(variables: Mapping[str, np.ndarray]) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """(igebm options, state dict, ignored names) for the release's variables; unknown names fail."""
    from jemeval.errors import CheckpointError

    def get(name: str) -> np.ndarray:
        key = f"{SCOPE}/{name}"
        if key not in variables:
            raise CheckpointError(f"the checkpoint lacks {key!r}, which the release's network needs")
        used.add(key)
        return variables[key]

    used: set[str] = set()
    if f"{SCOPE}/c1_pre/cweight" not in variables:
        raise CheckpointError(f"no {SCOPE}/c1_pre/cweight: not an IGEBM release checkpoint "
                              f"(first names: {sorted(variables)[:4]})")
    gamma = variables.get(f"{SCOPE}/atten/gamma")
    if gamma is not None and np.any(np.asarray(gamma) != 0):
        raise CheckpointError("the checkpoint was trained with --use_attention (atten/gamma is not 0); "
                              "this port implements the release's networks without attention")
    variant = identify_variant(variables)
    stem = get("c1_pre/cweight")
    state: dict[str, torch.Tensor] = {"stem.weight": _conv(stem), "stem.u": _vec(get("c1_pre/c_u"))}
    gains = get(f"{BLOCK_NAMES[variant][0]}_res_c2/g")
    conditional = np.ndim(gains) == 2
    for i, block in enumerate(BLOCK_NAMES[variant]):
        p = f"blocks.{i}."
        state[p + "conv1.weight"] = _conv(get(f"{block}_res_c1/cweight"))
        state[p + "conv1.u"] = _vec(get(f"{block}_res_c1/c_u"))
        state[p + "bias1"] = _rows(get(f"{block}_res_c1/gb"))
        state[p + "conv2.weight"] = _conv(get(f"{block}_res_c2/cweight"))
        state[p + "conv2.u"] = _vec(get(f"{block}_res_c2/c_u"))
        state[p + "bias2"] = _rows(get(f"{block}_res_c2/gb"))
        state[p + "gain2"] = _rows(get(f"{block}_res_c2/g"))
        offset = _vec(get(f"{block}_res_c2/cb"))
        # unconditional nets scale by g alone (cb is never read): zero it so the formula agrees
        state[p + "gain_offset2"] = offset if conditional else torch.zeros_like(offset)
        if f"{SCOPE}/{block}_res_adaptive/cweight" in variables:
            state[p + "shortcut.weight"] = _conv(get(f"{block}_res_adaptive/cweight"))
            state[p + "shortcut.u"] = _vec(get(f"{block}_res_adaptive/c_u"))
    fc = get("fc5/wweight")
    state["energy_head.weight"] = torch.from_numpy(np.ascontiguousarray(fc.T)).float()
    state["energy_head.bias"] = _vec(get("fc5/b"))
    ignored = sorted(k for k in variables if k not in used and _known_unused(k))
    unknown = sorted(k for k in variables if k not in used and not _known_unused(k))
    if unknown:
        raise CheckpointError(f"{len(unknown)} variable(s) this converter does not know: {unknown[:5]}"
                              f"{'...' if len(unknown) > 5 else ''}; see jemeval_igebm.convert_tf for the mapping")
    width = int(variables[f"{SCOPE}/res_optim_res_c1/cweight"].shape[-1])
    options = {"variant": variant, "width": width, "unit_input": True,
               "head": "leaky" if conditional and variant in ("large", "larger") else "relu"}
    if variant == "wider":
        options["stem_width"] = int(stem.shape[-1])
    return options, state, ignored


def _known_unused(name: str) -> bool:
    if _OPTIMIZER.search(name):
        return True
    m = re.match(rf"^{SCOPE}/([^/]+)/([^/]+)$", name)
    if not m:
        return False
    scope, field = m.groups()
    if scope in ("fc_dense", "atten"):
        return True
    kinds = ("res_c1", "res_c2", "res_adaptive")
    kind = "c1_pre" if scope == "c1_pre" else next((k for k in kinds if scope.endswith("_" + k)), None)
    return kind is not None and field in _UNUSED_FIELDS[kind]


def num_classes_of(state: dict[str, torch.Tensor]) -> int:
    return int(state["blocks.0.bias1"].shape[0])


def model_from_variables(variables: Mapping[str, np.ndarray]):
    """The jemeval EnergyModel (arch ``igebm``) holding the release's weights, and the conversion notes."""
    import jemeval
    from jemeval.errors import CheckpointError

    options, state, ignored = release_to_state_dict(variables)
    channels = int(state["stem.weight"].shape[1])
    model = jemeval.create_model("igebm", num_classes_of(state), (channels, 32, 32), **options)
    try:
        model.net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        lines = str(exc).splitlines()
        detail = next((line.strip() for line in lines if "size mismatch" in line or "Missing" in line), lines[0])
        raise CheckpointError(f"the release's tensors do not fit the {options['variant']} network: {detail}") from None
    return model.eval(), {"ignored_variables": len(ignored), "variant": options["variant"],
                          "conditional": num_classes_of(state) > 1}


# -- TensorFlow files --------------------------------------------------------------------------
LAYOUT_NAME = "igebm-tf-release"


def looks_like_tensorflow(path: str | Path) -> bool:
    """A TF1 checkpoint: a folder with a ``checkpoint`` file, an ``.index``/``.data-*`` file or a prefix."""
    path = Path(path)
    if path.is_dir():
        return (path / "checkpoint").exists()
    return path.suffix == ".index" or re.search(r"\.data-\d+-of-\d+$", path.name) is not None or (
        not path.exists() and Path(f"{path}.index").exists()
    )


def checkpoint_prefix(path: str | Path) -> str:
    """The TF1 checkpoint prefix for a prefix, an ``.index``/``.meta``/``.data-*`` file or a folder."""
    from jemeval.errors import UsageError

    p = Path(path)
    if p.is_dir():
        state = p / "checkpoint"
        if not state.exists():
            raise UsageError(f"{str(p)!r} holds no TensorFlow 'checkpoint' file; pass a checkpoint prefix such as "
                             f"{str(p / 'model_74700')!r}")
        m = re.search(r'model_checkpoint_path:\s*"([^"]+)"', state.read_text())
        if not m:
            raise UsageError(f"{str(state)!r} names no model_checkpoint_path; pass the checkpoint prefix itself")
        p = p / m.group(1) if not Path(m.group(1)).is_absolute() else Path(m.group(1))
    prefix = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", str(p))
    if not Path(prefix + ".index").exists():
        raise UsageError(f"no TensorFlow checkpoint at {prefix!r} ({prefix}.index is missing); pass the prefix "
                         "the release saved, e.g. cachedir/cifar10_cond/model_74700")
    return prefix


def read_tf_variables(prefix: str) -> dict[str, np.ndarray]:
    """Every variable of a TF1 checkpoint as numpy (the only place TensorFlow is imported)."""
    from jemeval.errors import CheckpointError, UsageError

    try:
        import tensorflow as tf
    except ImportError:
        raise UsageError("reading TensorFlow checkpoints needs TensorFlow: pip install 'jemeval-igebm[tf]'") from None
    try:
        reader = tf.train.load_checkpoint(prefix)
        return {name: np.asarray(reader.get_tensor(name)) for name in reader.get_variable_to_shape_map()}
    except Exception as exc:  # TF raises its own error types for damaged files
        raise CheckpointError(f"TensorFlow could not read {prefix!r}: {str(exc).splitlines()[0][:200]}") from None


def _source_hashes(prefix: str) -> dict[str, str]:
    from jemeval.provenance import file_sha256

    files = [Path(prefix + ".index")] + sorted(Path(prefix).parent.glob(Path(prefix).name + ".data-*"))
    return {f.name: file_sha256(f) for f in files}


def found_checkpoint(prefix: str):
    """The release checkpoint at ``prefix`` as a :class:`~jemeval.formats.foreign.FoundCheckpoint` (reads it)."""
    from jemeval.formats.foreign import FoundCheckpoint

    model, notes = model_from_variables(read_tf_variables(prefix))
    # the release clamps samples to its [0, 1] image box, which is [-1, 1] here
    return FoundCheckpoint(lambda path: model, layout=LAYOUT_NAME, config=notes, sgld={"clamp": [-1.0, 1.0]},
                           source=prefix, source_sha256=_source_hashes(prefix), notes=notes)


def match_tf_checkpoint(path: str):
    """The layout's ``match_path``: the release checkpoint at ``path``, or None when it is no TF checkpoint."""
    return found_checkpoint(checkpoint_prefix(path)) if looks_like_tensorflow(path) else None


def convert_tf_checkpoint(path_in: str | Path, path_out: str | Path, *, dataset: str | None = None):
    """Write the release checkpoint ``path_in`` as a jemeval checkpoint; returns a Result (what
    ``jemeval convert`` does for this layout, kept for the ``jemeval-igebm-convert`` script)."""
    from jemeval.formats.convert import check_dataset_name, check_output_path, convert_found

    check_output_path(path_in, path_out)
    if dataset is not None:
        check_dataset_name(dataset)
    found = found_checkpoint(checkpoint_prefix(path_in))
    return convert_found(found, path_in, path_out, dataset=dataset, command="jemeval-igebm-convert")


def main(argv=None) -> int:
    """``jemeval-igebm-convert IN OUT [--dataset NAME] [--json]``, the same as ``jemeval convert IN OUT``."""
    import click

    from jemeval.cli.options import emit, output_options
    from jemeval.errors import JemevalError, UsageError

    @click.command("jemeval-igebm-convert")
    @click.argument("path_in", metavar="IN")
    @click.argument("path_out", metavar="OUT")
    @click.option("--dataset", default=None,
                  help="The dataset the model was trained on (e.g. cifar10), recorded in OUT.")
    @output_options
    def cli(path_in, path_out, dataset, **output):
        """Convert an IGEBM TensorFlow release checkpoint IN (prefix, .index file or folder) to OUT.pt."""
        try:
            result = convert_tf_checkpoint(path_in, path_out, dataset=dataset)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
        except JemevalError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"wrote {path_out}", err=True)
        emit(result, columns=["layout", "variant", "num_classes", "dataset", "output"], **output)

    return cli.main(args=argv, prog_name="jemeval-igebm-convert", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main()
