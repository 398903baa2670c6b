"""Issue 35 item 4: your own RGB images. The strided first convolution of ``cnn:stride=2`` (checked
against the stride-1 network's first activation subsampled: a 3x3 convolution with padding 1 and
stride 2 is the stride-1 one read at every other position), and the generated image folder the
benchmark trains on (benchmarks/rgb_images.py)."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from jemeval.energy.factory import create_model
from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.training import resolve_config, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_training_resume import TINY, state_equal, tiny  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from rgb_images import CLASSES, write_rgb_folder  # noqa: E402


def test_stride_2_is_the_stride_1_network_read_at_every_other_position():
    torch.manual_seed(0)
    strided = create_model("cnn:width=8,stride=2", 10, (3, 32, 32)).eval()
    plain = create_model("cnn:width=8", 10, (3, 32, 32)).eval()
    assert [(k, v.shape) for k, v in strided.state_dict().items()] == [(k, v.shape) for k, v in
                                                                        plain.state_dict().items()]
    plain.load_state_dict(strided.state_dict())
    net = next(m for m in plain.modules() if type(m).__name__ == "SmallCNN")
    net.features[1].register_forward_hook(lambda module, inputs, out: out[:, :, ::2, ::2])  # the first activation
    x = torch.rand(5, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(strided(x), plain(x), atol=1e-5, rtol=0)


def test_stride_1_is_the_digits_network_exactly():
    torch.manual_seed(1)
    a = create_model("cnn:width=8,stride=1", 10, (1, 8, 8))
    torch.manual_seed(1)
    b = create_model("cnn:width=8", 10, (1, 8, 8))
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


@pytest.mark.parametrize("stride", [0, 9, 1.5])
def test_a_stride_outside_1_to_8_is_refused_in_one_line(stride):
    with pytest.raises(UsageError, match=r"cnn stride must be a whole number from 1 to 8"):
        create_model(f"cnn:stride={stride}", 10, (3, 32, 32))


def test_the_generated_folder_is_the_same_bytes_for_a_seed_and_no_test_image_is_a_training_image(tmp_path):
    def digests(root):
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*.png"))}

    spec = write_rgb_folder(tmp_path / "a", 40, 20, seed=3)
    write_rgb_folder(tmp_path / "b", 40, 20, seed=3)
    a, b = digests(tmp_path / "a"), digests(tmp_path / "b")
    assert spec == f"folder:{tmp_path / 'a'}" and a == b and len(a) == 60
    assert sorted(p.name for p in (tmp_path / "a" / "train").iterdir()) == list(CLASSES)
    train = {v for k, v in a.items() if k.startswith("train/")}
    assert not train & {v for k, v in a.items() if k.startswith("test/")}
    from PIL import Image

    image = np.asarray(Image.open(next((tmp_path / "a" / "test").rglob("*.png"))))
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8


# -- the p(x) warm-up: the classifier learns first -------------------------------------------------------
def test_the_sampling_weights_rise_linearly_over_the_px_warm_up():
    from jemeval.training.trainer import sampling_weight_scale

    config = resolve_config("digits", px_warmup_iters=4)
    assert [sampling_weight_scale(config, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert {sampling_weight_scale(resolve_config("digits"), s) for s in range(3)} == {1.0}  # digits: the release's


def test_each_iteration_of_the_warm_up_weighs_p_x_by_its_share(tmp_path):
    """The loss of every iteration is its cross-entropy plus (step + 1) / 4 of its p(x) term, then all of it."""
    seen = []

    def watch(trainer):
        step = trainer.train_step
        if not getattr(step, "watched", False):
            def watched(*args, **kwargs):
                stats = step(*args, **kwargs)
                seen.append({k: float(stats[k]) for k in ("loss", "pyx", "px")})
                return stats
            watched.watched, watched.sgld, watched.last_samples = True, step.sgld, None
            trainer.train_step = watched

    config = resolve_config("digits[0-2]", **{**TINY, "epochs": 1, "px_warmup_iters": 4, "energy_l2": 0.0,
                                              "out": str(tmp_path / "r")})
    train(config, on_step=watch)
    assert len(seen) >= 7
    for step, stats in enumerate(seen[:7], start=1):  # iteration 0 runs before the watch is set
        share = min(1.0, (step + 1) / 4)
        assert stats["loss"] == pytest.approx(stats["pyx"] + share * stats["px"], rel=1e-5, abs=1e-6)


def test_a_run_resumed_inside_the_px_warm_up_equals_the_uninterrupted_one(tmp_path):
    changes = {"px_warmup_iters": 15}  # 10 iterations an epoch: the resume lands inside the warm-up
    full = train(tiny(tmp_path, "full", **changes)).records[0]
    train(tiny(tmp_path, "half", epochs=1, **changes))
    resumed = train(tiny(tmp_path, "half", resume=True, **changes)).records[0]
    a, b = read_checkpoint(full["last"]), read_checkpoint(resumed["last"])
    assert state_equal(a["state_dict"], b["state_dict"]) and torch.equal(a["replay_buffer"], b["replay_buffer"])


def test_a_set_without_a_recipe_derives_the_px_warm_up_and_the_recipes_keep_theirs(tmp_path):
    spec = write_rgb_folder(tmp_path / "rgb", 200, 20, seed=0, easy=True)
    config = resolve_config(spec)
    per_epoch = (200 - 20) // 64  # 10% held out for validation
    assert config.px_warmup_iters == round(0.4 * per_epoch * config.epochs)
    assert "px_warmup_iters" in config.derived["settings"]
    assert resolve_config(spec, px_warmup_iters=7).px_warmup_iters == 7
    assert resolve_config("digits").px_warmup_iters == 0


def test_a_set_without_a_recipe_derives_a_tenth_of_the_px_weight_only_for_the_jem_objective(tmp_path):
    spec = write_rgb_folder(tmp_path / "rgb", 60, 10, seed=0, easy=True)
    config = resolve_config(spec)
    assert config.px_weight == 0.1 and "px_weight" in config.derived["settings"]
    assert resolve_config(spec, px_weight=1.0).px_weight == 1.0  # given: kept, not called derived
    assert "px_weight" not in resolve_config(spec, px_weight=0.0).derived["settings"]
    factored = resolve_config(spec, objective="factored")  # the ablation has no p(x) term: it stays 0
    assert factored.px_weight == 0.0 and "px_weight" not in factored.derived["settings"]
    assert resolve_config("digits").px_weight == 1.0 and resolve_config("digits").derived is None


def test_images_of_32_pixels_a_side_derive_the_strided_network_unless_an_arch_or_a_source_is_given(tmp_path):
    spec = write_rgb_folder(tmp_path / "rgb", 60, 10, seed=0, easy=True)
    assert resolve_config(spec).arch == "cnn:stride=2" and "arch" in resolve_config(spec).derived["settings"]
    assert resolve_config(spec, arch="cnn:width=16").arch == "cnn:width=16"
    small = tmp_path / "small.npz"
    np.savez(small, x_train=np.zeros((40, 16, 16, 3), np.uint8), y_train=np.arange(40) % 4)
    assert resolve_config(f"npz:{small}").arch == "cnn"  # under 32 a side: the full-resolution network


def test_a_warm_start_on_32_pixel_images_keeps_its_sources_network(tmp_path):
    from jemeval.formats.native import save_checkpoint

    spec = write_rgb_folder(tmp_path / "rgb", 60, 10, seed=0, easy=True)
    save_checkpoint(tmp_path / "clf.pt", create_model("cnn:width=8", 10, (3, 32, 32)))
    config = resolve_config(spec, init=str(tmp_path / "clf.pt"))
    assert config.arch == "cnn:width=8" and "arch" not in config.derived["settings"]
