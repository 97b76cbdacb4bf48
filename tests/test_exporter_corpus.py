"""Verdicts on graphs as other exporters write them: weights as ``Constant`` nodes, FP16 weights behind ``Cast``,
weights behind ``Transpose``, older opsets, unnamed nodes, external data, recurrent layers, ``Einsum``. Every
graph is normalised before any recipe (constants folded into initializers, the function unchanged), and no
precision case passes with fewer layers in its precision than the recipe promises."""
import functools
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from exporters import save_external, torch_export, weights_as_constants
from quantverdict.export.normalise import normalised
from quantverdict.precision.settings import RecipeSettings
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline

REWRITES = {"constants": {}, "fp16-cast": {"fp16_behind_cast": True}, "transposed": {"transposed_matrices": True},
            "unnamed": {"unnamed": True}}


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _manifest(folder: Path, name: str, graph: Path, inputs: str, outputs: list[str], task: str = "regression") -> Path:
    (folder / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        models:
          - name: {name}
            onnx: {graph}
            inputs: {inputs}
            outputs: {outputs}
            task: {task}
            calibration: synthetic
            recipe: {{int8: {{calibration: max}}, fp8: {{calibration: max}}}}
        """))
    return folder / f"{name}.yaml"


@pytest.fixture(scope="module")
def cnn_graphs(tmp_path_factory, request) -> dict[str, Path]:
    """The built-in CNN exported by torch at opset 11 (with initializers), and rewritten as other converters
    write it."""
    import torch

    pipeline = request.getfixturevalue("qv_pipeline")
    folder = tmp_path_factory.mktemp("corpus")
    model = torch_export(pipeline.store.module("cnn"), (torch.zeros(4, 3, 32, 32),), ["image"], ["scores/logits.0"], 11)
    graphs = {"initializers": folder / "initializers.onnx"}
    onnx.save(model, str(graphs["initializers"]))
    for label, rewrite in REWRITES.items():
        graphs[label] = folder / f"{label}.onnx"
        onnx.save(weights_as_constants(model, **rewrite), str(graphs[label]))
    graphs["external"] = save_external(model, folder / "external.onnx")
    return graphs


@pytest.mark.parametrize("label", [*REWRITES, "external"])
def test_normalising_keeps_the_function_and_puts_every_weight_in_an_initializer(cnn_graphs, label):
    model = onnx.load(str(cnn_graphs[label]))
    folded = normalised(model)
    assert not [node for node in folded.graph.node if node.op_type in ("Constant", "Cast", "Transpose")]
    assert all(node.name for node in folded.graph.node) and len({n.name for n in folded.graph.node}) == len(
        folded.graph.node)
    conv_weights = {node.input[1] for node in folded.graph.node if node.op_type in ("Conv", "Gemm")}
    assert conv_weights <= {init.name for init in folded.graph.initializer}
    feeds = {"image": np.random.default_rng(0).uniform(-1, 1, (4, 3, 32, 32)).astype(np.float32)}
    before, after = _outputs(model, feeds)[0], _outputs(folded, feeds)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * float(np.abs(before).max()))


@pytest.mark.int8
@pytest.mark.parametrize("label", [*REWRITES, "external"])
def test_constant_node_weights_are_quantized_as_fully_as_initializers(qv_pipeline, cnn_graphs, tmp_path, label):
    """The same network, its weights where another converter puts them: the same layers quantized, the same
    recipe verdict (its Q/DQ semantics equal to float noise), coverage in the record."""
    inputs = "[{name: image, shape: [4, 3, 32, 32]}]"
    results, semantics = {}, {}
    for which in ("initializers", label):
        pipeline = Pipeline(qv_pipeline.cache.root, manifest=_manifest(tmp_path, f"cnn-{which}", cnn_graphs[which],
                                                                       inputs, ["scores/logits.0"]))
        results[which] = pipeline.run(Case(f"cnn-{which}", "int8", "onnxruntime"))
        recipe = pipeline.recipes.recipe(f"cnn-{which}", "int8", "emulated")
        semantics[which] = pipeline.store.semantics(f"cnn-{which}", recipe)["scores/logits.0"]
    reference, rewritten = results["initializers"], results[label]
    cover, other = reference.metrics["coverage"], rewritten.metrics["coverage"]
    assert cover["layers"] == cover["quantized"] == 3 and other["quantized"] == other["layers"] == 3
    assert rewritten.status == reference.status == "passed", rewritten.message
    if label != "fp16-cast":  # FP16 weights are other weights: the same recipe, another function
        np.testing.assert_allclose(semantics[label], semantics["initializers"], rtol=1e-4,
                                   atol=1e-4 * float(np.abs(semantics["initializers"]).max()))


@pytest.mark.int8
@pytest.mark.parametrize("label", ["initializers", *REWRITES])
def test_onnx_runtimes_quantizer_is_judged_on_an_opset_11_graph(qv_pipeline, cnn_graphs, tmp_path, label):
    """``quantize_static`` writes per-channel weights (DequantizeLinear's ``axis``, opset 13) into a graph of any
    opset, which ONNX's checker then refuses (an opset-11 export: "Unrecognized attribute: axis"); the graph it is
    given is converted to opset 13 first, so its column in ``compare-recipes`` and the CPU lane's INT8 are judged."""
    from quantverdict.judge.recipe_comparison import compare_quantizers

    assert onnx.load(str(cnn_graphs[label])).opset_import[0].version == 11
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=_manifest(
        tmp_path, f"cnn11-{label}", cnn_graphs[label], "[{name: image, shape: [4, 3, 32, 32]}]", ["scores/logits.0"]))
    results, _ = compare_quantizers(pipeline.store, f"cnn11-{label}", "int8",
                                    {"onnxruntime": RecipeSettings(quantizer="onnxruntime")},
                                    functools.partial(pipeline.recipes.with_fallback, f"cnn11-{label}"))
    assert not results[0].error, results[0].error
    assert results[0].coverage["quantized"] == 3 and results[0].metrics["cosine"] > 0.99


@pytest.mark.int8
@pytest.mark.parametrize("label", [*REWRITES, "external"])
def test_each_kept_layer_is_in_its_own_format_whatever_wrote_the_graph(qv_pipeline, cnn_graphs, tmp_path, label):
    """Fallback over several formats on the network as other converters write it: each kept layer in the format the
    rule gives, the graph and the verdict's reasons agreeing (``test_fallback._check_formats``), and the same
    formats as from torch's own graph (FP16 weights behind a Cast are other weights: their own choice)."""
    from test_fallback import OFFERED, _check_formats

    inputs = "[{name: image, shape: [4, 3, 32, 32]}]"
    formats = {}
    for which in ("initializers", label):
        manifest = _manifest(tmp_path, f"cnn-{which}", cnn_graphs[which], inputs, ["scores/logits.0"])
        pipeline = Pipeline(qv_pipeline.cache.root, manifest=manifest, recipe_settings={"int8": {
            "fallback": 0.5, "fallback_format": OFFERED}})
        _check_formats(pipeline, f"cnn-{which}", set(), manifest)
        formats[which] = sorted(pipeline.recipes.recipe(f"cnn-{which}", "int8", "emulated").options.kept().values())
    assert formats["initializers"]
    if label != "fp16-cast":
        assert formats[label] == formats["initializers"]


class _Recurrent:
    """A sequence embedder: recurrent layers (almost all of its weights) and one Linear."""

    @staticmethod
    def make(kind: str):
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                layer = getattr(torch.nn, kind)
                self.rnn = layer(16, 32, num_layers=2, batch_first=True, bidirectional=True)
                self.head = torch.nn.Linear(64, 8)

            def forward(self, x):
                return self.head(self.rnn(x)[0][:, -1])

        torch.manual_seed(0)
        return Net()


@pytest.mark.int8
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_are_counted_and_an_int8_verdict_is_not_given_for_them(qv_pipeline, tmp_path, kind):
    """torch exports a 2-layer bidirectional LSTM/GRU as two ``LSTM``/``GRU`` nodes: counted, reported in float with
    the reason, and the INT8 case is skipped (most of its weights would run in float), never passed."""
    import torch

    path = tmp_path / f"{kind}.onnx"
    onnx.save(torch_export(_Recurrent.make(kind), (torch.zeros(2, 5, 16),), ["tokens"], ["embedding"], 17), str(path))
    manifest = _manifest(tmp_path, "seq", path, "[{name: tokens, shape: [2, 5, 16]}]", ["embedding"])
    result = Pipeline(qv_pipeline.cache.root, manifest=manifest).run(Case("seq", "int8", "onnxruntime"))
    coverage = result.metrics["coverage"]
    assert coverage["kinds"] == {kind: [0, 2], "Gemm": [1, 1]}
    assert result.status == "skipped", result.message
    assert "runs 1 of 3 weighted layers of 'seq' in INT8" in result.message and f"2 {kind} in float" in result.message
    assert all(reason.startswith("no kernel:") for reason in coverage["kept"].values())


def _projection(opset: int) -> onnx.ModelProto:
    """A projection written as ``Einsum`` (an attention exporter's habit), then a ``MatMul`` by a matrix that arrives
    as a graph input (a product of activations, as attention's are: no weights, no layer): unnamed nodes, an unnamed
    dynamic dimension, an output name with ``/`` and ``.``."""
    weight = numpy_helper.from_array(np.random.default_rng(1).normal(0, 0.2, (8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Einsum", ["x", "w"], ["h"], equation="bij,jk->bik"),
             helper.make_node("MatMul", ["h", "v"], ["out/y.0"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 8]),
                                           helper.make_tensor_value_info("v", TensorProto.FLOAT, [8, 8])],
                              [helper.make_tensor_value_info("out/y.0", TensorProto.FLOAT, [None, 4, 8])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.int8
def test_an_einsum_projection_is_counted_and_kept_in_float_with_its_reason(qv_pipeline, tmp_path):
    path = tmp_path / "einsum.onnx"
    onnx.save(_projection(13), str(path))
    manifest = _manifest(tmp_path, "proj", path, "[{name: x, shape: [2, 4, 8]}, {name: v, shape: [8, 8]}]",
                         ["out/y.0"])
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=manifest)
    coverage = pipeline.store.coverage("proj", pipeline.recipes.recipe("proj", "int8", "emulated"))
    assert coverage["kinds"] == {"Einsum": [0, 1]}  # the MatMul of two activations holds no weights
    assert list(coverage["kept"].values()) == ["no kernel: no INT8 Einsum kernel in TensorRT or ONNX Runtime"]
    result = pipeline.run(Case("proj", "int8", "onnxruntime"))  # all of its weights are the Einsum's
    assert result.status == "skipped" and "1 Einsum in float" in result.message, result.message


@pytest.mark.int8
def test_a_layer_whose_weight_the_recipe_cannot_see_fails_the_case_naming_it(qv_pipeline, tmp_path):
    """A convolution whose filter arrives at run time (a graph input): the recipe does not quantize it and gives no
    reason, so the INT8 case fails with the count and the kind, whatever its outputs say."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "k"], ["y"], name="dynamic_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["y", "w"], ["z"], name="static_conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16, 8, 8]),
                                           helper.make_tensor_value_info("k", TensorProto.FLOAT, [16, 16, 3, 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 16, 8, 8])],
                              [numpy_helper.from_array(rng.normal(0, 0.1, (16, 16, 1, 1)).astype(np.float32), "w")])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    manifest = _manifest(tmp_path, "dyn", path, "[{name: x, shape: [2, 16, 8, 8]}, {name: k, shape: [16, 16, 3, 3]}]",
                         ["z"])
    result = Pipeline(qv_pipeline.cache.root, manifest=manifest).run(Case("dyn", "int8", "onnxruntime"))
    assert result.status == "failed", result.message
    assert result.message == (
        "dyn-int8-onnxruntime: INT8 ran on 1 of 2 weighted layers of 'dyn': 1 Conv in float that the recipe did not "
        "keep in float by name (its weight is computed at run time, not a constant): 'dynamic_conv'")


def test_output_names_a_graph_does_not_have_are_one_line_listing_those_it_has(qv_pipeline, cnn_graphs, tmp_path):
    manifest = _manifest(tmp_path, "named", cnn_graphs["constants"], "[{name: image, shape: [4, 3, 32, 32]}]",
                         ["scores"])
    result = Pipeline(qv_pipeline.cache.root, manifest=manifest).run(Case("named", "fp32", "onnxruntime"))
    assert result.status == "error"
    assert result.message.splitlines()[0] == (
        f"named-fp32-onnxruntime: model 'named': outputs ['scores'] are not outputs of {cnn_graphs['constants']}; "
        "its outputs: ['scores/logits.0']")


@pytest.mark.int8
def test_layers_inside_a_loop_body_are_counted_and_never_passed_in_float(qv_pipeline, tmp_path):
    """A recurrence written as a ``Loop`` whose body multiplies by a weight of the outer graph (what exporters of
    scripted loops write): the recipe does not enter bodies, so the body's layer is float and the INT8 case fails
    naming it, where counting the top level alone saw one layer, quantized."""
    rng = np.random.default_rng(4)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "w"], ["h_lin"], name="step"),
         helper.make_node("Tanh", ["h_lin"], ["h_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [None, 16])])
    nodes = [helper.make_node("Loop", ["trips", "", "x"], ["h"], name="recurrence", body=body),
             helper.make_node("Gemm", ["h", "head"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
                              [numpy_helper.from_array(np.array(3, np.int64), "trips"),
                               numpy_helper.from_array(rng.normal(0, 0.25, (16, 16)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.normal(0, 0.25, (16, 4)).astype(np.float32), "head")])
    path = tmp_path / "loop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    manifest = _manifest(tmp_path, "looped", path, "[{name: x, shape: [4, 16]}]", ["y"])
    result = Pipeline(qv_pipeline.cache.root, manifest=manifest).run(Case("looped", "int8", "onnxruntime"))
    assert result.status == "failed", result.message
    assert result.message == (
        "looped-int8-onnxruntime: INT8 ran on 1 of 2 weighted layers of 'looped': 1 MatMul in float that the recipe "
        "did not keep in float by name (inside a Loop body, which the recipe does not enter): 'recurrence/step'")


def _needs(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed ({extra}; pip install -e '.[dev]' does)")


@pytest.mark.int8
def test_a_scikit_learn_classifier_converted_by_skl2onnx_is_judged_on_its_declared_outputs(qv_pipeline, tmp_path):
    """skl2onnx writes an MLP as MatMul/Add at opset 21 beside an ``ai.onnx.ml`` domain, with an int64 label output
    and a softmax: only the declared outputs are judged, every MatMul runs in INT8; the probabilities are a
    distribution, the label is labels (judged by how many agree, and read as the class where labels give accuracy),
    and left out, it is not judged."""
    _needs("skl2onnx", "scikit-learn's ONNX converter")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    images, labels = load_digits(return_X_y=True)
    images = (images / 16).astype(np.float32)
    with _quiet():
        classifier = MLPClassifier((64, 32), max_iter=60, random_state=0).fit(images, labels)
    model = to_onnx(classifier, images[:1], options={id(classifier): {"zipmap": False}})
    path = tmp_path / "digits-mlp.onnx"
    onnx.save(model, str(path))
    manifest = _manifest(tmp_path, "digits-mlp", path, "[{name: X, shape: [16, 64], range: [0, 1]}]",
                         ["probabilities"], task="classification")
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=manifest)
    assert pipeline.store.output_kinds("digits-mlp") == {"label": "labels", "probabilities": "distribution"}
    result = pipeline.run(Case("digits-mlp", "int8", "onnxruntime"))
    assert result.metrics["coverage"]["kinds"] == {"MatMul": [3, 3]}
    assert set(result.metrics["metrics"]) == {"probabilities"}
    assert result.status == "passed", result.message
    both = _manifest(tmp_path, "digits-mlp", path, "[{name: X, shape: [16, 64], range: [0, 1]}]",
                     ["label", "probabilities"], task="classification")
    (tmp_path / "digits.py").write_text(textwrap.dedent("""\
        import numpy as np
        from sklearn.datasets import load_digits
        from quantverdict.models.spec import LabeledData

        def labelled():
            images, labels = load_digits(return_X_y=True)
            batches = [{"X": (images[i:i + 16] / 16).astype(np.float32)} for i in range(0, 320, 16)]
            return LabeledData(batches, labels[:320])
        """))
    both.write_text(both.read_text() + "    eval: digits:labelled\n")
    sys.path.insert(0, str(tmp_path))
    try:
        judged = Pipeline(qv_pipeline.cache.root, manifest=both).run(Case("digits-mlp", "int8", "onnxruntime"))
    finally:
        sys.path.remove(str(tmp_path))
    assert judged.status == "passed", judged.message
    assert judged.metrics["metrics"]["label"]["label_samples"] == 320
    assert judged.metrics["task"]["reference_accuracy"] > 0.9  # the label read as the class, not argmax'd


@pytest.mark.int8
def test_torchs_dynamo_exporter_graphs_are_covered_like_the_torchscript_ones(qv_pipeline, tmp_path):
    """The dynamo exporter (onnxscript) writes opset 20 with BatchNorm folded and an ``LSTM`` node: the CNN's every
    layer runs in INT8; the recurrent network's LSTM is counted, and its INT8 case is not passed."""
    _needs("onnxscript", "torch's dynamo ONNX exporter")
    import torch

    class Convnet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm, self.head = torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.Linear(16, 10)

        def forward(self, x):
            return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    cases = {"dyn-cnn": (Convnet(), (torch.zeros(4, 3, 16, 16),), "[{name: x, shape: [4, 3, 16, 16]}]"),
             "dyn-lstm": (_Recurrent.make("LSTM"), (torch.zeros(2, 5, 16),), "[{name: x, shape: [2, 5, 16]}]")}
    results = {}
    for name, (module, args, inputs) in cases.items():
        with _quiet():
            program = torch.onnx.export(module.eval(), args, dynamo=True, input_names=["x"], output_names=["y"])
        path = tmp_path / f"{name}.onnx"
        program.save(str(path), external_data=False)
        results[name] = Pipeline(qv_pipeline.cache.root, manifest=_manifest(tmp_path, name, path, inputs, ["y"])).run(
            Case(name, "int8", "onnxruntime"))
    assert results["dyn-cnn"].status == "passed", results["dyn-cnn"].message
    assert results["dyn-cnn"].metrics["coverage"]["quantized"] == results["dyn-cnn"].metrics["coverage"]["layers"] == 2
    assert results["dyn-lstm"].status == "skipped" and "LSTM in float" in results["dyn-lstm"].message


def _quiet():
    import contextlib
    import logging
    import warnings

    @contextlib.contextmanager
    def quiet():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)
            try:
                yield
            finally:
                logging.disable(previous)

    return quiet()
