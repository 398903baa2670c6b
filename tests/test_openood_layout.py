"""OpenOOD v1.5's data as it lies (issue 37, item 1): ``--data-root`` at a folder laid out as OpenOOD's
download script leaves it, ``--id imagenet --ood near,far`` reads exactly its lists.

The tests build the layout themselves (tiny JPEGs, lists in OpenOOD's ``relative/path label`` format,
``images_largescale/``, ``images_classic/``, ``benchmark_imglist/imagenet/``) and a random-weight
timm resnet18 in the Hub cache (tests/test_pretrained.py). The references: OpenOOD's DATA_INFO (set
names, groups), scikit-learn on the saved per-example scores, timm's and torchvision's own
evaluation transforms on the same files.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.metrics import roc_auc_score, roc_curve
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from test_pretrained import offline, timm_resnet18, torchvision_resnet18  # noqa: F401 - fixtures

import jemeval
from jemeval.cli import cli

#: OpenOOD v1.5's ImageNet-1k sets (DATA_INFO["imagenet"]["ood"]): name -> (images folder, group)
IMAGENET_OOD = {"ssb_hard": ("images_largescale", "near"), "ninco": ("images_largescale", "near"),
                "inaturalist": ("images_largescale", "far"), "textures": ("images_classic", "far"),
                "openimage_o": ("images_largescale", "far")}
#: the folder each set's images sit in, as OpenOOD's zips unpack them
OOD_FOLDER = {"ssb_hard": "ssb_hard", "ninco": "ninco", "inaturalist": "inaturalist", "textures": "texture",
              "openimage_o": "openimage_o"}
N_ID, N_OOD = 6, 3


def _jpeg(path: Path, rng: np.random.Generator, size=(16, 16)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path, quality=90)


def openood_tree(root: Path, seed: int = 0) -> Path:
    """OpenOOD's layout for ImageNet-1k: ID = test_imagenet.txt (labels are ImageNet class indices),
    the five OOD lists; returns the data root."""
    rng = np.random.default_rng(seed)
    lists = root / "benchmark_imglist" / "imagenet"
    lists.mkdir(parents=True)
    id_lines = []
    for i in range(N_ID):
        rel = f"imagenet_1k/val/ILSVRC2012_val_{i + 1:08d}.JPEG"
        _jpeg(root / "images_largescale" / rel, rng, (16 + 2 * i, 20))  # sizes differ: every one is resized
        id_lines.append(f"{rel} {[0, 1, 2, 999, 65, 1][i]}")
    (lists / "test_imagenet.txt").write_text("\n".join(id_lines) + "\n")
    for name, (images, _) in IMAGENET_OOD.items():
        lines = []
        for i in range(N_OOD):
            rel = f"{OOD_FOLDER[name]}/{name}_{i}.jpg"
            _jpeg(root / images / rel, rng)
            lines.append(f"{rel} {-1 if i % 2 else 0}")
        (lists / f"test_{name}.txt").write_text("\n".join(lines))  # no newline at the end: OpenOOD's lists vary
    return root


def _ood(args, data_root: Path) -> CliRunner:
    return runner().invoke(cli, ["ood", "--model", "timm:resnet18", "--device", "cpu", "--data-root", str(data_root),
                                 "--id", "imagenet", "--batch-size", "8", *args])


def _fpr95_sklearn(id_s: np.ndarray, ood_s: np.ndarray) -> float:
    """scikit-learn's ROC curve at the first threshold keeping 95% of the ID inputs."""
    fpr, tpr, _ = roc_curve(np.r_[np.ones(len(id_s)), np.zeros(len(ood_s))], np.r_[id_s, ood_s],
                            drop_intermediate=False)
    return float(fpr[np.argmax(tpr >= 0.95)])


def test_imagenet_near_far_reads_openoods_lists_and_metrics_equal_sklearn(timm_resnet18, tmp_path):  # noqa: F811
    root = openood_tree(tmp_path / "data")
    scores = tmp_path / "s.npz"
    result = _ood(["--ood", "near,far", "--score", "maxprob,energy", "--save-scores", str(scores), "--json"], root)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {(r["score"], r["ood"]): r for r in out["records"]}
    sets = [*IMAGENET_OOD, "near", "far"]
    assert sorted(rows) == sorted((s, name) for s in ("maxprob", "energy") for name in sets)
    f = np.load(scores)
    for score in ("maxprob", "energy"):
        id_s = f[f"id/{score}"]
        assert len(id_s) == N_ID
        for name, (_, group) in IMAGENET_OOD.items():
            r, ood_s = rows[(score, name)], f[f"ood/{name}/{score}"]
            assert (r["group"], r["n_id"], r["n_ood"]) == (group, N_ID, N_OOD)
            labels = np.r_[np.ones(N_ID), np.zeros(N_OOD)]
            assert r["auroc"] == pytest.approx(roc_auc_score(labels, np.r_[id_s, ood_s]), abs=1e-12)
            assert r["fpr95"] == pytest.approx(_fpr95_sklearn(id_s, ood_s), abs=1e-12)
        for group in ("near", "far"):
            members = [n for n, (_, g) in IMAGENET_OOD.items() if g == group]
            assert rows[(score, group)]["auroc"] == pytest.approx(np.mean([rows[(score, n)]["auroc"]
                                                                           for n in members]))
            assert rows[(score, group)]["n_ood"] == N_OOD * len(members)
    info = out["provenance"]["settings"]["sets"]
    assert info["imagenet"]["info"]["list"] == str(root / "benchmark_imglist" / "imagenet" / "test_imagenet.txt")
    assert info["textures"]["info"]["images"] == str(root / "images_classic")
    prep = info["imagenet"]["info"]["preprocessing"]
    assert (prep["resize"], prep["crop"], prep["interpolation"]) == (235, [224, 224], "bicubic")  # 224 / 0.95


def test_openood_cifar10_reads_its_lists_with_its_set_names(timm_resnet18, tmp_path):  # noqa: F811
    """``--id openood:cifar10``: OpenOOD's CIFAR-10 lists (images_classic), its sets by its names
    (``texture``, not jemeval's ``textures``) in its groups."""
    rng = np.random.default_rng(1)
    root, lists = tmp_path / "data", tmp_path / "data" / "benchmark_imglist" / "cifar10"
    lists.mkdir(parents=True)
    sets = {"cifar100": "near", "tin": "near", "mnist": "far", "svhn": "far", "texture": "far", "places365": "far"}
    for name in ["cifar10", *sets]:
        rels = [f"{name}/test/{i}.png" for i in range(N_OOD)]
        for rel in rels:
            _jpeg(root / "images_classic" / rel, rng, (32, 32))
        (lists / f"test_{name}.txt").write_text("".join(f"{rel} {i}\n" for i, rel in enumerate(rels)))
    result = runner().invoke(cli, ["ood", "--model", "timm:resnet18", "--device", "cpu", "--data-root", str(root),
                                   "--id", "openood:cifar10", "--ood", "near,far", "--score", "maxprob", "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["records"]
    assert [(r["ood"], r["group"]) for r in records] == [
        ("cifar100", "near"), ("tin", "near"), ("near", "near"),
        ("mnist", "far"), ("svhn", "far"), ("texture", "far"), ("places365", "far"), ("far", "far")]


def test_a_train_list_without_its_images_is_no_split_and_one_with_them_is_checked(timm_resnet18, tmp_path):  # noqa: F811
    """OpenOOD's script leaves train_imagenet.txt without ImageNet's training images: that split is not
    there, and ood runs. With its images there, an evaluated image that is also a training image is said."""
    root = openood_tree(tmp_path / "data")
    lists = root / "benchmark_imglist" / "imagenet"
    (lists / "train_imagenet.txt").write_text("imagenet_1k/train/n01440764/a.JPEG 0\nimagenet_1k/train/b.JPEG 1\n")
    args = ["--ood", "ssb_hard", "--score", "maxprob", "--json"]
    result = _ood(args, root)
    assert result.exit_code == 0, result.output + result.stderr
    assert "train split" not in result.stderr
    first_test = root / "images_largescale" / "imagenet_1k" / "val" / "ILSVRC2012_val_00000001.JPEG"
    for rel in ("imagenet_1k/train/n01440764/a.JPEG", "imagenet_1k/train/b.JPEG"):
        (root / "images_largescale" / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "images_largescale" / "imagenet_1k/train/n01440764/a.JPEG").write_bytes(first_test.read_bytes())
    _jpeg(root / "images_largescale" / "imagenet_1k/train/b.JPEG", np.random.default_rng(9))
    result = _ood(args, root)
    assert result.exit_code == 0, result.output + result.stderr
    assert "1 of the 6 test images of imagenet is also in imagenet's train split" in result.stderr


def test_list_images_go_through_the_models_own_preprocessing(timm_resnet18, torchvision_resnet18,  # noqa: F811
                                                              tmp_path):
    """A list image through jemeval (its [-1, 1] input, then the model's normalisation) equals the
    library's own evaluation transform of the same file."""
    import timm.data
    import torch
    from PIL import Image
    from torchvision import models

    root = openood_tree(tmp_path / "data")
    refs = {"timm:resnet18": timm.data.create_transform(**timm.data.resolve_data_config(model=timm_resnet18[0])),
            "torchvision:resnet18": models.ResNet18_Weights.IMAGENET1K_V1.transforms()}
    for source, reference in refs.items():
        model = jemeval.load_model(source)
        ds = jemeval.load_dataset("imagenet", "test", root, input_shape=model.input_shape,
                                  preprocess=model.metadata["preprocessing"])
        x, y = ds[3]
        assert y == 999 and ds.num_classes == 1000
        norm = model.normalization
        ours = (x - torch.tensor(norm["mean"])[:, None, None]) / torch.tensor(norm["std"])[:, None, None]
        with Image.open(ds.files[3]) as im:
            theirs = reference(im.convert("RGB"))
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_imagenet_labels_are_the_models_classes(timm_resnet18, tmp_path):  # noqa: F811
    """The ID list's labels are ImageNet class indices: eval reads them as the 1000-class model's
    classes with no class map. The list is rewritten to label 4 images with the model's own argmax
    and 2 with another class: accuracy 4/6."""
    import torch

    root = openood_tree(tmp_path / "data")
    model = jemeval.load_model("timm:resnet18")
    ds = jemeval.load_dataset("imagenet", "test", root, input_shape=model.input_shape,
                              preprocess=model.metadata["preprocessing"])
    with torch.no_grad():
        pred = model(torch.stack([ds[i][0] for i in range(len(ds))])).argmax(1).numpy()
    labels = np.where(np.arange(N_ID) < 4, pred, (pred + 1) % 1000)
    path = root / "benchmark_imglist" / "imagenet" / "test_imagenet.txt"
    rels = [line.split(" ")[0] for line in path.read_text().splitlines()]
    path.write_text("".join(f"{rel} {y}\n" for rel, y in zip(rels, labels)))
    result = runner().invoke(cli, ["eval", "--model", "timm:resnet18", "--device", "cpu", "--data-root", str(root),
                                   "--data", "imagenet", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["records"][0]
    assert record["accuracy"] == pytest.approx(4 / 6)
    assert json.loads(result.stdout)["provenance"]["settings"].get("class_map") is None  # nothing mapped


# -- bad input: one line, nothing written ------------------------------------------------------------
def _refused(args, root: Path, expected: str, tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    assert_one_line_refusal(_ood([*args, "--score", "maxprob", "--save-scores", str(tmp_path / "s.npz")], root),
                            expected)
    assert snapshot(tmp_path) == before


def test_a_list_naming_missing_files_is_one_line_with_the_count_and_the_first(timm_resnet18, tmp_path):  # noqa: F811
    root = openood_tree(tmp_path / "data")
    (root / "images_largescale" / "ninco" / "ninco_1.jpg").unlink()
    (root / "images_largescale" / "ninco" / "ninco_2.jpg").unlink()
    _refused(["--ood", "near"], root, "2 of the 3 images", tmp_path)
    _refused(["--ood", "near"], root, "(the first: line 2, 'ninco/ninco_1.jpg')", tmp_path)


@pytest.mark.parametrize("line", ["../../secret.jpg 0", "/etc/passwd 0", "ssb_hard/../../x.jpg -1"])
def test_a_list_path_leaving_the_images_folder_is_refused(timm_resnet18, tmp_path, line):  # noqa: F811
    root = openood_tree(tmp_path / "data")
    (tmp_path / "secret.jpg").write_bytes((root / "images_largescale" / "ssb_hard" / "ssb_hard_0.jpg").read_bytes())
    path = root / "benchmark_imglist" / "imagenet" / "test_ssb_hard.txt"
    path.write_text(path.read_text() + "\n" + line + "\n")
    _refused(["--ood", "ssb_hard"], root, f"line 4: {line.split()[0]!r} leaves", tmp_path)


def test_no_such_benchmark_folder_says_did_you_mean(timm_resnet18, tmp_path):  # noqa: F811
    root = openood_tree(tmp_path / "data")
    (root / "benchmark_imglist" / "imagenet").rename(root / "benchmark_imglist" / "imagenet_1k")
    _refused(["--ood", "near"], root, "has no folder 'imagenet' (did you mean 'imagenet_1k'?)", tmp_path)
    _refused(["--ood", "near"], tmp_path, "has no benchmark_imglist/ folder (it has data/benchmark_imglist", tmp_path)


def test_an_unknown_openood_set_or_benchmark_is_one_line(timm_resnet18, tmp_path):  # noqa: F811
    root = openood_tree(tmp_path / "data")
    _refused(["--ood", "openood:imagenet/ssb"], root, "no OOD set 'ssb' (did you mean 'ssb_hard'?)", tmp_path)
    _refused(["--ood", "openood:imagenet2OO/ninco"], root,
             "no benchmark 'imagenet2OO' (did you mean 'imagenet' or 'imagenet200'?)", tmp_path)


# -- item 5: the report's OpenOOD export on the ImageNet benchmark -------------------------------------
IMAGENET_FILE = json.loads((Path(__file__).parent / "data" / "leaderboards" / "openood_v1.5_imagenet1k.json")
                           .read_text(encoding="utf-8"))


def test_report_exports_openoods_imagenet_columns(timm_resnet18, torchvision_resnet18, tmp_path):  # noqa: F811
    """``report --id imagenet --ood near,far --model timm:... --model torchvision:... --export openood``
    writes OpenOOD's ImageNet file: its header, one number a cell as its imagenet1k_ood.csv holds them
    (kept in tests/data/leaderboards with its source), the near/far means and the accuracy of the report,
    Arch the library's model name and Additional_Description as OpenOOD describes such weights."""
    import csv
    import re

    root = openood_tree(tmp_path / "data")
    out = tmp_path / "rep"
    args = ["report", "--out", str(out), "--model", "timm:resnet18", "--model", "torchvision:resnet18", "--id",
            "imagenet", "--ood", "near,far", "--sections", "accuracy,ood", "--score", "maxprob,energy",
            "--refine-steps", "0", "--data-root", str(root), "--device", "cpu", "--export", "openood",
            "--set", "export.outlier_data=no", "--json"]
    result = runner().invoke(cli, args)
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    text = (out / "openood.csv").read_text(encoding="utf-8")
    real = IMAGENET_FILE["first_lines"]
    assert text.split("\n")[0] == real[0]
    with open(out / "openood.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cell = re.compile(IMAGENET_FILE["number_cell"])
    real_rows = list(csv.DictReader(real + IMAGENET_FILE["other_rows"]))
    assert all(cell.fullmatch(r[k]) for r in real_rows for k in ("Near-OOD_AUROC", "Far-OOD_AUROC", "ID_Accuracy"))
    assert [(r["Training"], r["Postprocessor"]) for r in rows] == [
        (m, p) for m in ("timm:resnet18", "torchvision:resnet18") for p in ("MSP", "EBO")]
    expected = {"timm:resnet18": ("resnet18.a1_in1k", "timm ckpt"),
                "torchvision:resnet18": ("resnet18", "torchvision ckpt IMAGENET1K_V1")}
    for row, score in zip(rows, ["maxprob", "energy"] * 2):
        model = row["Training"]
        mine = [r for r in report["records"] if r["section"] == "ood" and r["model"] == model and r["score"] == score]
        for group, field in (("near", "Near-OOD_AUROC"), ("far", "Far-OOD_AUROC")):
            members = [r["auroc"] for r in mine if r["group"] == group and r["ood"] != group]
            assert len(members) == (2 if group == "near" else 3)
            assert cell.fullmatch(row[field]) and "±" not in row[field]
            assert row[field] == f"{100 * np.mean(members):.2f}"
        (acc,) = [r["accuracy"] for r in report["records"] if r["section"] == "accuracy" and r["model"] == model]
        assert row["ID_Accuracy"] == f"{100 * acc:.2f}"
        assert (row["Arch"], row["Additional_Description"], row["Outlier_Data"]) == (*expected[model], "No")
