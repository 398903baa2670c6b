"""jemeval's tutorial plugin: one component of each kind and one command, registered through the hooks.

jemeval finds this module through the entry point in pyproject.toml::

    [project.entry-points.jemeval]
    example = "jemeval_example.plugin"

Each ``register_<kind>s`` hook receives ``register(name, obj, *, help=None)``; objects are factories
or callables that jemeval calls only when the component is used. A detector subclasses
``jemeval.Detector`` and an attack ``jemeval.Attack`` (the class is registered: jemeval makes one
instance per use); their capabilities are class attributes with defaults. ``register_commands``
receives the click group of the ``jemeval`` command line.

jemeval imports this module to list its commands (``jemeval --help``), so it imports only light
modules at the top; torch and numpy are imported inside the functions that use them.
"""
from __future__ import annotations

import click

import jemeval


# -- a model: factory(num_classes, input_shape, **options) -> nn.Module giving logits ----------
def example_mlp(num_classes, input_shape, *, hidden: int = 64):
    """A two-layer LeakyReLU MLP on flattened images."""
    import numpy as np
    from torch import nn

    d = int(np.prod(input_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(d, int(hidden)), nn.LeakyReLU(0.2),
                         nn.Linear(int(hidden), num_classes))


# -- a dataset: factory(split, root, download, **options) -> Dataset of (x in [-1, 1], y) ------
def example_stripes(split, root, download, *, n: int = 200, size: int = 8):
    """Horizontal (class 0) or vertical (class 1) stripes with noise; 8x8 grayscale."""
    import torch

    from jemeval.data import ArrayDataset

    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    y = torch.arange(int(n)) % 2
    base = (torch.arange(int(size)) % 2).float() * 2 - 1            # -1, 1, -1, 1, ...
    horizontal = base.view(-1, 1).expand(size, size)
    vertical = base.view(1, -1).expand(size, size)
    x = torch.where(y.view(-1, 1, 1) == 0, horizontal, vertical).clone()
    x = (x * 0.8 + 0.2 * (torch.rand(x.shape, generator=g) * 2 - 1)).clamp(-1, 1)
    return ArrayDataset(x.unsqueeze(1), y, num_classes=2, name="example-stripes")


# -- a score: obj(model, x) -> Tensor[N], higher = more in-distribution ------------------------
def example_l2(model, x):
    """Minus the L2 norm of the logits (a toy score: confident inputs have large logits)."""
    import torch

    with torch.no_grad():
        return -model.logits(x).norm(dim=1)


# -- a detector: a score with a fit stage; fit once, then score(model, x) ------------------------
class ExampleCentroid(jemeval.Detector):
    """Cosine similarity of the penultimate features to their mean over the training images.

    Written on the features jemeval computes once per batch for every detector (``fit_features`` and
    ``score_features``, so ``uses_features`` is True); ``fit(model, dataset)`` and ``score(model, x)``
    come from jemeval.Detector. With ``state_dict``/``load_state_dict`` (``cacheable``) jemeval caches
    the fitted state on disk, so a second run does not fit again.
    """

    def __init__(self):
        self.center = None

    def fit_features(self, model, features, logits, labels):
        self.center = features.mean(dim=0)
        return self

    def score_features(self, features, logits):
        import torch

        return torch.nn.functional.cosine_similarity(features, self.center.to(features.device)[None], dim=1)

    def state_dict(self):
        return {"center": self.center}

    def load_state_dict(self, state):
        self.center = state["center"]


# -- a metric: marked with its task; OOD metrics take (id_scores, ood_scores) -------------------
@jemeval.ood_metric
def example_detection_error(id_scores, ood_scores) -> float:
    """Minimal detection error: min over thresholds of 0.5 * (FNR on ID + FPR on OOD)."""
    import numpy as np

    id_scores, ood_scores = np.asarray(id_scores, float), np.asarray(ood_scores, float)
    thresholds = np.concatenate([id_scores, ood_scores, [np.inf]])
    fnr = (id_scores[None, :] < thresholds[:, None]).mean(1)
    fpr = (ood_scores[None, :] >= thresholds[:, None]).mean(1)
    return float((0.5 * (fnr + fpr)).min())


# -- an attack: the class is the factory, ExampleNoise(norm, **options)(model, x, y, epsilons) -----
class ExampleNoise(jemeval.Attack):
    """Random noise at the full epsilon: a sanity baseline any real attack must beat."""

    name = "example-noise"
    norms = ("l2", "linf")      # capabilities are declared; the others keep their defaults

    def __init__(self, norm, *, seed: int = 0):
        super().__init__(norm)  # refuses a norm not in `norms`, in one line
        self.seed = int(seed)

    @property
    def settings(self):         # recorded in the results, shown by repr()
        return {**super().settings, "seed": self.seed}

    def forward(self, model, x, y, epsilons, eot_samples=None):  # the model is in eval mode here
        import torch

        g = torch.Generator(device=x.device).manual_seed(self.seed)
        out = []
        for eps in epsilons:
            eps_model = jemeval.pixel_to_model_scale(eps)   # pixel units -> [-1, 1] space
            if self.norm == "linf":
                delta = eps_model * torch.sign(torch.randn(x.shape, generator=g, device=x.device))
            else:
                d = torch.randn(x.shape, generator=g, device=x.device)
                delta = eps_model * d / d.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            out.append((x + delta).clamp(-1, 1))
        return torch.stack(out)


# -- a command: `jemeval example-count DATASET` -------------------------------------------------
@click.command("example-count")
@click.argument("dataset")
@click.option("--split", default="test", show_default=True, help="Split of DATASET.")
def example_count(dataset, split):
    """Count the examples of each class of DATASET (any registered dataset)."""
    import collections

    ds = jemeval.load_dataset(dataset, split)  # an unknown name fails as one line, like any command
    counts = collections.Counter(int(y) for _, y in ds)
    for label in sorted(counts):
        click.echo(f"class {label}: {counts[label]}")


@jemeval.hookimpl
def register_models(register):
    register("example-mlp", example_mlp)


@jemeval.hookimpl
def register_datasets(register):
    register("example-stripes", example_stripes)


@jemeval.hookimpl
def register_scores(register):
    register("example-l2", example_l2)
    register("example-centroid", ExampleCentroid)


@jemeval.hookimpl
def register_metrics(register):
    register("example-detection-error", example_detection_error)


@jemeval.hookimpl
def register_attacks(register):
    register("example-noise", ExampleNoise)


@jemeval.hookimpl
def register_commands(cli):
    cli.add_command(example_count)
