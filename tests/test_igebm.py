"""The jemeval-igebm plugin: registered with its version; logits = -E(x, y) of the IGEBM release's
network (checked against a reference forward written from the release's description, in numpy
and, when TensorFlow is installed, in TensorFlow on a real TF1 checkpoint); the release's spectral
norm; clear errors; a briefly trained digits model runs through ``ood`` and ``calibrate``."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from click.testing import CliRunner

jemeval_igebm = pytest.importorskip("jemeval_igebm")

from jemeval_igebm.convert_tf import model_from_variables, read_tf_variables  # noqa: E402

import jemeval  # noqa: E402
from jemeval import testing  # noqa: E402
from jemeval.cli import cli  # noqa: E402
from jemeval.errors import CheckpointError, UsageError  # noqa: E402
from jemeval.plugins import get_plugin_manager, reset_plugin_manager  # noqa: E402
from jemeval.sampling.sgld import model_log_p  # noqa: E402

# -- the release's network, from its description ---------------------------------------------
# Block order and which blocks average-pool, per network of the release's models.py.
RELEASE_NETS = {
    "resnet32": [("res_optim", True), ("res_1", False), ("res_2", True), ("res_3", False), ("res_4", True),
                 ("res_5", False)],
    "large": [("res_optim", True), ("res_1", False), ("res_2", False), ("res_3", True), ("res_4", False),
              ("res_5", False),
              ("res_6", True), ("res_7", False), ("res_8", False)],
}
RELEASE_NETS["wider"] = RELEASE_NETS["large"]
MULTIPLIERS = {"resnet32": [1, 1, 2, 2, 2, 2], "large": [1, 1, 1, 2, 2, 2, 4, 4, 4],
               "wider": [1, 1, 1, 2, 2, 2, 4, 4, 4]}


def release_variables(net: str, *, classes: int, width: int, stem: int | None = None, channels: int = 3, seed: int = 0):
    """Random values for every variable the release creates (unused ones and optimizer state too)."""
    rng = np.random.default_rng(seed)
    v: dict[str, np.ndarray] = {}
    f32 = lambda a: np.asarray(a, dtype=np.float32)

    def conv(scope, c_in, c_out, scale=1.0):
        v[f"context_0/{scope}/cweight"] = f32(rng.normal(size=(3, 3, c_in, c_out)) * scale)
        v[f"context_0/{scope}/c_u"] = f32(rng.normal(size=(1, c_out)))
        v[f"context_0/{scope}/b"] = f32(rng.normal(size=c_out))
        per = (lambda c: (classes, c)) if classes > 1 else (lambda c: (c,))
        v[f"context_0/{scope}/g"] = f32(1 + 0.3 * rng.normal(size=per(c_out)))
        v[f"context_0/{scope}/gb"] = f32(0.3 * rng.normal(size=per(c_in)))
        v[f"context_0/{scope}/cb"] = f32(0.3 * rng.normal(size=c_in))  # nonzero even where the release ignores it

    c = stem or width
    conv("c1_pre", channels, c)
    for i, ((block, _), mult) in enumerate(zip(RELEASE_NETS[net], MULTIPLIERS[net])):
        out = width * mult
        conv(f"{block}_res_c1", c, out)
        conv(f"{block}_res_c2", out, out, scale=0.02 if i % 2 else 1.0)  # spectral norm below and above 1
        if c != out:
            conv(f"{block}_res_adaptive", c, out)
        c = out
    v["context_0/fc5/wweight"] = f32(rng.normal(size=(c, 1)))
    v["context_0/fc5/b"] = f32(rng.normal(size=1))
    v["context_0/fc_dense/wweight"] = f32(rng.normal(size=(4, 4)))
    v["context_0/fc_dense/w_u"] = f32(rng.normal(size=(1, 4)))
    v["context_0/atten/atten_q_weight"] = f32(rng.normal(size=(1, 1, 4, 2)))
    v["context_0/atten/gamma"] = f32(np.zeros(1))
    v["context_0/c1_pre/cweight/Adam"] = np.zeros_like(v["context_0/c1_pre/cweight"])
    v["context_0/c1_pre/cweight/Adam_1"] = np.zeros_like(v["context_0/c1_pre/cweight"])
    v["beta1_power"], v["beta2_power"] = f32(0.9), f32(0.999)
    return v


def release_energy(get, images, onehot, net: str, conditional: bool, ops):
    """E(x, y) as the release computes it (NHWC images in [0, 1], one-hot labels), written with
    ``ops`` so that the same description runs in numpy and in TensorFlow."""
    def spectral(scope, lower_bound=False):
        w = get(f"{scope}/cweight")
        m = ops.reshape(w, (-1, ops.shape(w)[-1]))
        v_hat = ops.l2n(ops.matmul(get(f"{scope}/c_u"), ops.transpose(m)))
        u_hat = ops.l2n(ops.matmul(v_hat, m))
        sigma = ops.matmul(ops.matmul(v_hat, m), ops.transpose(u_hat))
        if lower_bound:
            sigma = sigma + 1e-6
            return w / sigma * ops.minimum(sigma, 1.0)
        return w / sigma

    def per_class(name):
        value = get(name)
        return ops.matmul(onehot, value)[:, None, None, :] if conditional else value

    h = ops.leaky(ops.conv(images, spectral("c1_pre")))
    for block, pool in RELEASE_NETS[net]:
        c1 = ops.leaky(ops.conv(h + per_class(f"{block}_res_c1/gb"), spectral(f"{block}_res_c1")))
        gain = get(f"{block}_res_c2/g")
        scale = (ops.matmul(onehot, gain) + get(f"{block}_res_c2/cb"))[:, None, None, :] if conditional else gain
        c2 = ops.conv(c1 + per_class(f"{block}_res_c2/gb"), spectral(f"{block}_res_c2", lower_bound=True)) * scale
        skip = ops.conv(h, spectral(f"{block}_res_adaptive")) if ops.has(f"{block}_res_adaptive/cweight") else h
        res = c2 + skip
        h = ops.leaky(ops.avg_pool2(res) if pool else res)
    h = ops.leaky(h) if conditional and net == "large" else ops.relu(h)
    return ops.matmul(ops.sum_hw(h), get("fc5/wweight"))[:, 0] + get("fc5/b")[0]


def numpy_ops(variables):
    def conv(x, w):
        k, pad = w.shape[0], w.shape[0] // 2
        _, hgt, wid, _ = x.shape
        xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        return sum(np.einsum("nhwc,co->nhwo", xp[:, i:i + hgt, j:j + wid], w[i, j]) for i in range(k) for j in range(k))

    return types.SimpleNamespace(
        conv=conv, matmul=np.matmul, transpose=np.transpose, reshape=np.reshape, shape=np.shape,
        l2n=lambda a: a / np.sqrt(max(float((a * a).sum()), 1e-12)), minimum=np.minimum,
        leaky=lambda a: np.where(a > 0, a, 0.2 * a), relu=lambda a: np.maximum(a, 0),
        avg_pool2=lambda a: a.reshape(a.shape[0], a.shape[1] // 2, 2, a.shape[2] // 2, 2, a.shape[3]).mean(axis=(2, 4)),
        sum_hw=lambda a: a.sum(axis=(1, 2)), has=lambda name: f"context_0/{name}" in variables,
    )


def reference_logits_numpy(variables, x_nchw: torch.Tensor, net: str, classes: int) -> np.ndarray:
    """-E(x, y) for every class from the numpy reference, inputs given in jemeval's [-1, 1] NCHW."""
    get = lambda name: variables[f"context_0/{name}"].astype(np.float64)
    images = ((x_nchw.double().numpy() + 1) / 2).transpose(0, 2, 3, 1)
    cols = [-release_energy(get, images, np.eye(classes)[[k] * len(images)], net, classes > 1, numpy_ops(variables))
            for k in range(classes)]
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("net,classes,width,stem",
                         [("resnet32", 3, 4, None), ("large", 1, 3, None), ("wider", 2, 3, 5)])
def test_converted_release_variables_give_the_reference_logits(net, classes, width, stem):
    variables = release_variables(net, classes=classes, width=width, stem=stem, seed=len(net))
    model, notes = model_from_variables(variables)
    assert notes["variant"] == net and model.num_classes == classes and model.arch == "igebm"
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        logits = model(x)
    expected = reference_logits_numpy(variables, x, net, classes)
    assert np.allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_unknown_release_variables_and_attention_fail_clearly(monkeypatch):
    variables = release_variables("resnet32", classes=2, width=2)
    with pytest.raises(CheckpointError, match=r"does not know: \['context_0/mystery/w'\]"):
        model_from_variables({**variables, "context_0/mystery/w": np.zeros(2, np.float32)})
    with pytest.raises(CheckpointError, match="use_attention"):
        model_from_variables({**variables, "context_0/atten/gamma": np.ones(1, np.float32)})
    with pytest.raises(CheckpointError, match="not an IGEBM release checkpoint"):
        model_from_variables({"model/w": np.zeros(1)})
    monkeypatch.setitem(__import__("sys").modules, "tensorflow", None)  # as if TensorFlow were not installed
    with pytest.raises(UsageError, match=r"pip install 'jemeval-igebm\[tf\]'"):
        read_tf_variables("nowhere/model_1")


# -- the PyTorch model ---------------------------------------------------------------------------
def small_igebm(classes=4, seed=0, **options):
    torch.manual_seed(seed)
    model = jemeval.create_model("igebm", classes, (1, 8, 8), width=4, blocks=1, **options)
    with torch.no_grad():  # move the conditional parameters away from their neutral initial values
        for block in model.net.blocks:
            for p in (block.bias1, block.bias2, block.gain_offset2):
                p.normal_(0, 0.3)
            block.gain2.normal_(1, 0.3)
            block.conv2.weight.normal_(0, 0.5)
    return model.eval()


def test_igebm_is_a_plugin_model_listed_with_its_version():
    testing.check_model("igebm", num_classes=10, input_shape=(1, 8, 8), width=4, blocks=1)
    res = CliRunner().invoke(cli, ["plugins", "--json"])
    entry = next(p for p in json.loads(res.stdout) if p["name"] == "igebm")
    assert entry["version"] == jemeval_igebm.__version__ == "0.1.0" and entry["distribution"] == "jemeval-igebm"
    assert entry["registered"] == {"model": ["igebm"], "checkpoint_layout": ["igebm-tf-release"]}
    assert entry["error"] is None and "register_checkpoint_layouts" in entry["hooks"]
    with pytest.raises(UsageError, match="unknown IGEBM variant 'huge'"):
        jemeval.create_model("igebm:variant=huge", 10, (1, 8, 8))


def test_logits_are_negative_class_energies_computed_in_one_pass():
    model = small_igebm()
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(3)) * 2 - 1
    y = torch.tensor([0, 3, 1, 2, 3])
    with torch.no_grad():
        logits = model(x)
        one_by_one = torch.stack([-model.net.energy(x, torch.full((5,), k)) for k in range(4)], dim=1)
        assert torch.allclose(logits, one_by_one, atol=1e-5)
        assert torch.allclose(model.log_pxy(x, y), logits.gather(1, y[:, None]).squeeze(1), atol=1e-5)
        assert torch.allclose(model_log_p(model, x, y), model.log_pxy(x, y))  # conditional SGLD's path
        assert torch.allclose(model.probs(x), torch.softmax(one_by_one, dim=1), atol=1e-6)


def test_spectral_norm_follows_the_release():
    model = small_igebm()
    conv = model.net.blocks[0].conv1
    u0 = conv.u.clone()
    with torch.no_grad():
        model(torch.zeros(1, 1, 8, 8))
    assert torch.equal(conv.u, u0)  # eval mode never updates u (the release's spec_eval)
    model.train()
    with torch.no_grad():
        for _ in range(40):  # one power iteration per training forward, as in the release
            model(torch.zeros(1, 1, 8, 8))
    model.eval()
    w = conv.normalized_weight().reshape(conv.weight.shape[0], -1)
    assert abs(torch.linalg.matrix_norm(w, ord=2).item() - 1.0) < 1e-3
    small = model.net.blocks[0].conv2
    with torch.no_grad():
        small.weight.mul_(1e-3)  # norm below 1: the residual's last conv is left as it is
    assert torch.allclose(small.normalized_weight(), small.weight, rtol=1e-4, atol=0)


def test_igebm_checkpoint_needs_the_plugin_and_says_so(tmp_path):
    path = tmp_path / "igebm.pt"
    jemeval.save_checkpoint(path, small_igebm(), dataset="digits")
    assert torch.allclose(jemeval.load_model(path)(torch.zeros(2, 1, 8, 8)), small_igebm()(torch.zeros(2, 1, 8, 8)))
    try:
        get_plugin_manager().unregister("igebm")  # as if jemeval-igebm were uninstalled
        assert "igebm" not in jemeval.names("model") and "cnn" in jemeval.names("model")
        with pytest.raises(CheckpointError, match="needs model architecture 'igebm'"):
            jemeval.load_model(path)
    finally:
        reset_plugin_manager()
    assert "igebm" in jemeval.names("model")


# -- the TensorFlow release format -----------------------------------------------------------
# TensorFlow runs in subprocesses: once it is loaded, importing torch's triton (as training does)
# aborts the process, so the pytest process itself never imports it.
TF_SETTINGS = {"net": "resnet32", "classes": 3, "width": 4, "seed": 11, "n": 4}


def write_tf_release_checkpoint(prefix: str, npz_path: str) -> None:
    """Build the release's graph from :func:`release_variables`, save it as a TF1 checkpoint at
    ``prefix`` and write the images and TensorFlow's logits (-E for every class) to ``npz_path``."""
    import tensorflow as tf

    v1, s = tf.compat.v1, TF_SETTINGS
    variables = release_variables(s["net"], classes=s["classes"], width=s["width"], seed=s["seed"])
    images = np.random.default_rng(1).uniform(size=(s["n"], 8, 8, 3)).astype(np.float32)
    with tf.Graph().as_default():
        tf_vars = {name: v1.get_variable(name, initializer=value) for name, value in variables.items()}
        ops = types.SimpleNamespace(
            conv=lambda x, w: tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME"), matmul=tf.matmul, transpose=tf.transpose,
            reshape=tf.reshape, shape=lambda w: w.get_shape().as_list(), l2n=tf.nn.l2_normalize, minimum=tf.minimum,
            leaky=tf.nn.leaky_relu, relu=tf.nn.relu,
            avg_pool2=lambda a: tf.nn.avg_pool(a, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
            sum_hw=lambda a: tf.reduce_sum(a, [1, 2]), has=lambda name: f"context_0/{name}" in variables)
        label = v1.placeholder(tf.float32, (None, s["classes"]))
        energy = release_energy(lambda name: tf_vars[f"context_0/{name}"], tf.constant(images), label, s["net"], True,
                                ops)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            v1.train.Saver().save(sess, prefix)
            eye = np.eye(s["classes"])
            logits = np.stack([-sess.run(energy, {label: eye[[k] * s["n"]]}) for k in range(s["classes"])], axis=1)
    np.savez(npz_path, images=images, logits=logits)


def test_tensorflow_checkpoint_converts_to_the_tensorflow_logits(tmp_path):
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed (pip install 'jemeval-igebm[tf]')")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    (tmp_path / "cifar10_cond").mkdir()
    prefix, npz = tmp_path / "cifar10_cond" / "model_74700", tmp_path / "tf.npz"
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_igebm; "
              f"test_igebm.write_tf_release_checkpoint({str(prefix)!r}, {str(npz)!r})")
    made = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert made.returncode == 0, made.stderr[-2000:]
    out, by_script = tmp_path / "igebm.pt", tmp_path / "igebm_script.pt"
    converted = subprocess.run([sys.executable, "-m", "jemeval", "convert", str(tmp_path / "cifar10_cond"), str(out),
                                "--dataset", "cifar10", "--json"], capture_output=True, text=True, env=env, check=False)
    assert converted.returncode == 0, converted.stderr[-2000:]
    record = json.loads(converted.stdout)["records"][0]
    assert record["variant"] == "resnet32" and record["ignored_variables"] > 0
    script = subprocess.run([sys.executable, "-m", "jemeval_igebm.convert_tf", str(prefix), str(by_script), "--json"],
                            capture_output=True, text=True, env=env, check=False)  # the plugin's older script
    assert script.returncode == 0, script.stderr[-2000:]
    assert json.loads(script.stdout)["records"][0]["source_sha256"] == record["source_sha256"]
    assert torch.equal(jemeval.load_model(by_script)(torch.zeros(1, 3, 8, 8)),
                       jemeval.load_model(out)(torch.zeros(1, 3, 8, 8)))
    model = jemeval.load_model(out)
    assert model.metadata["config"]["source_layout"] == "igebm-tf-release" and model.metadata["dataset"] == "cifar10"
    tf_run = np.load(npz)
    x = torch.from_numpy(tf_run["images"].transpose(0, 3, 1, 2)) * 2 - 1
    with torch.no_grad():
        logits = model(x).numpy()
    assert np.allclose(logits, tf_run["logits"], rtol=1e-5, atol=1e-5 * np.abs(tf_run["logits"]).max())


def test_jemeval_convert_reads_tensorflow_checkpoints_through_the_plugin_layout(tmp_path, monkeypatch):
    """The plugin's layout recognises TF1 checkpoint paths for `jemeval convert`; jemeval itself
    knows nothing of TensorFlow or of this plugin."""
    (tmp_path / "model_100.index").write_bytes(b"")
    monkeypatch.setitem(__import__("sys").modules, "tensorflow", None)  # as if TensorFlow were not installed
    r = CliRunner().invoke(cli, ["convert", str(tmp_path / "model_100"), str(tmp_path / "o.pt")])
    assert r.exit_code == 2, r.output
    assert "reading TensorFlow checkpoints needs TensorFlow: pip install 'jemeval-igebm[tf]'" in r.output
    listing = json.loads(CliRunner().invoke(cli, ["list", "checkpoint_layouts", "--json"]).stdout)
    assert [c["plugin"] for c in listing["checkpoint_layout"] if c["name"] == "igebm-tf-release"] == ["igebm"]
    try:
        get_plugin_manager().unregister("igebm")  # as if jemeval-igebm were uninstalled
        r = CliRunner().invoke(cli, ["convert", str(tmp_path / "model_100"), str(tmp_path / "o.pt")])
        assert r.exit_code == 1 and "does not exist" in r.output and "igebm" not in r.output
    finally:
        reset_plugin_manager()
    assert not (tmp_path / "o.pt").exists()


def test_jemeval_convert_of_a_release_folder_with_a_faked_tensorflow_reader(tmp_path, monkeypatch):
    """The whole `jemeval convert` path of the plugin's layout, everywhere: TensorFlow's reader is
    replaced by the release's variables (the TensorFlow test above reads a real TF1 checkpoint)."""
    import hashlib

    from jemeval_igebm import convert_tf

    folder = tmp_path / "cifar10_cond"
    folder.mkdir()
    (folder / "checkpoint").write_text('model_checkpoint_path: "model_5"\n')
    files = {"model_5.index": b"index bytes", "model_5.data-00000-of-00001": b"data bytes"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    variables = release_variables("resnet32", classes=3, width=4, seed=2)
    monkeypatch.setattr(convert_tf, "read_tf_variables", lambda prefix: variables if prefix == str(folder / "model_5")
                        else pytest.fail(f"read {prefix}"))
    r = CliRunner().invoke(cli, ["convert", str(folder), str(tmp_path / "out.pt"), "--dataset", "cifar10", "--json"])
    assert r.exit_code == 0, r.output
    record = json.loads(r.stdout)["records"][0]
    assert record["layout"] == "igebm-tf-release" and record["source"] == str(folder / "model_5")
    assert record["source_sha256"] == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert record["variant"] == "resnet32" and record["num_classes"] == 3 and record["dataset"] == "cifar10"
    model = jemeval.load_model(tmp_path / "out.pt")
    assert model.metadata["config"]["source_layout"] == "igebm-tf-release"
    assert model.metadata["config"]["sgld"] == {"clamp": [-1.0, 1.0]}
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        logits = model(x).numpy()
    expected = reference_logits_numpy(variables, x, "resnet32", 3)
    assert np.allclose(logits, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


# -- end to end: train briefly on digits, then ood and calibrate --------------------------------
def test_briefly_trained_igebm_runs_through_ood_and_calibrate(tmp_path):
    runner = CliRunner()
    trained = runner.invoke(cli, [
        "train", "digits", "--arch", "igebm:width=4,blocks=1", "--objective", "factored", "--epochs", "1",
        "--sgld-steps", "2", "--warmup-iters", "0", "--buffer-size", "100", "--batch-size", "128",
        "--out", str(tmp_path / "run"),
        "--no-progress", "--json", "--device", "cpu"])
    assert trained.exit_code == 0, trained.output
    ckpt = json.loads(trained.stdout)["best"]
    model = jemeval.load_model(ckpt, device="cpu")
    assert model.arch == "igebm" and model.metadata["dataset"] == "digits"

    ood = runner.invoke(cli, ["ood", "--model", ckpt, "--ood", "uniform,interp", "--n", "100", "--device", "cpu",
                              "--json"])
    assert ood.exit_code == 0, ood.output
    records = json.loads(ood.stdout)["records"]
    assert {(r["score"], r["ood"].split(":")[0]) for r in records} == {
        (s, o) for s in ("logpx", "maxprob", "gradnorm") for o in ("uniform", "interp")}
    assert all(0.0 <= r["auroc"] <= 1.0 and r["n_id"] == 100 for r in records)

    calibrated = runner.invoke(cli, ["calibrate", "--model", ckpt, "--device", "cpu", "--json"])
    assert calibrated.exit_code == 0, calibrated.output
    summary = json.loads(calibrated.stdout)["records"][0]
    test = jemeval.load_dataset("digits", "test")
    with torch.no_grad():
        accuracy = (model.predict(test.x) == test.y).float().mean().item()
    assert summary["n"] == len(test) == 450 and abs(summary["accuracy"] - accuracy) < 1e-6
    assert 0.0 <= summary["ece"] <= 1.0
