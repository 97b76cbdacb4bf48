"""Each layer quantized alone (sensitivity, fallback's ranking) is made from the whole recipe's preparation, calibration
and rounding, and evaluated in worker processes: the same graph bytes the recipe with ``only`` makes by itself, the
same outputs, kept and cached one by one as their errors against FP32's."""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from float_kernels import assert_errors_agree
from quantverdict.judge import layers_alone
from quantverdict.judge.layer_errors import Errors, signal_energy
from quantverdict.judge.semantics import unkept_semantics
from quantverdict.judge.sensitivity import weighted_layers
from quantverdict.precision import get_recipe
from quantverdict.run.pipeline import Pipeline

pytestmark = pytest.mark.int8


def _tied_weights(folder: Path) -> Path:
    """Two MatMuls reading one weight (tied layers) and a Gemm of its own: GPTQ rounds a shared weight per layer."""
    rng = np.random.default_rng(0)
    tied = numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32), "tied")
    head = numpy_helper.from_array(rng.normal(size=(4, 16)).astype(np.float32), "head")
    nodes = [helper.make_node("MatMul", ["x", "tied"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("MatMul", ["b", "tied"], ["c"], name="second"),
             helper.make_node("Gemm", ["c", "head"], ["logits"], name="head_gemm", transB=1)]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [32, 4])], [tied, head])
    path = folder / "tied.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (folder / "models.yaml").write_text("models:\n  - name: tied\n    onnx: tied.onnx\n"
                                        "    inputs: [{name: x, shape: [32, 16], range: [-2, 2]}]\n"
                                        "    outputs: [logits]\n    calibration: synthetic\n")
    return folder / "models.yaml"


CASES = [("resblock", "int8", {"equalize": True, "gptq": True}), ("transformer-block", "int8",
                                                                   {"smoothquant": 0.5, "gptq": True}),
         ("cnn", "fp8", {"calibration": "mse", "gptq": True}), ("tied", "int8", {"gptq": True}),
         ("mlp", "int8", {"calibration": "percentile"})]


@pytest.mark.parametrize("model,precision,settings", CASES, ids=[case[0] for case in CASES])
def test_each_layer_alone_is_the_graph_its_only_recipe_makes(tmp_path, model, precision, settings):
    pipeline = Pipeline(tmp_path / "cache", manifest=_tied_weights(tmp_path) if model == "tied" else None)
    store = pipeline.store
    recipe = get_recipe(precision).configured(settings).with_options(fallback_layers=())
    layers = [node.name for node in weighted_layers(store, model, recipe)]
    graphs = store.precision_graph(model, recipe).layer_graphs()
    assert graphs.shared == ({"first", "second"} if model == "tied" else set())
    for layer in layers:
        assert graphs.graph(layer) == store.precision_graph(model, recipe.with_options(only=(layer,))).make(), layer


@pytest.mark.parametrize("model,precision,settings", [("transformer-block", "int8", {"smoothquant": 0.5, "gptq": True}),
                                                      ("resblock", "int8", {}), ("resblock", "fp8", {"calibration": "mse"})])
def test_layers_alone_in_workers_give_each_graphs_errors_and_are_cached(tmp_path, monkeypatch, model, precision,
                                                                        settings):
    """Three workers on any machine, this process one of them: each layer's errors against FP32 are those of its own
    graph's outputs as written, up to the float kernels' rounding (a recipe unpickled in a worker once lost its format's
    identity, and with it the first convolution's Q/DQ); a second ranking reads them all from the cache, bit for bit,
    and starts no worker."""
    monkeypatch.setattr(layers_alone, "cpus_per_worker", lambda: 3)
    monkeypatch.setattr(layers_alone, "LAYERS_PER_WORKER", 1)
    started = []
    popen = layers_alone.subprocess.Popen
    monkeypatch.setattr(layers_alone.subprocess, "Popen", lambda command, *args, **kwargs: started.extend(
        [command] if layers_alone.__name__ in command else []) or popen(command, *args, **kwargs))
    store = Pipeline(tmp_path / "cache").store
    recipe = get_recipe(precision).configured(settings).with_options(fallback_layers=())
    layers = [node.name for node in weighted_layers(store, model, recipe)]
    assert layers_alone.worker_count(1 << 20, len(layers)) == 3
    found = store.layers_alone_errors(model, recipe, layers, "calibration")
    assert len(started) == 2  # the third is this process
    batches, reference = store.batches(model, "calibration"), store.fp32_outputs(model, "calibration")
    for layer, errors in zip(layers, found):
        graph = store.precision_graph(model, recipe.with_options(only=(layer,))).make()
        expected = Errors.of(reference, unkept_semantics(graph, batches, threads=1))
        assert errors.arrays().keys() == expected.arrays().keys()
        assert_errors_agree(errors, expected, reference, layer)
    monkeypatch.setattr(layers_alone, "_in_workers", None)  # a worker started now would fail the call
    again = store.layers_alone_errors(model, recipe, layers, "calibration")
    assert all(np.array_equal(a.arrays()[key], b.arrays()[key]) for a, b in zip(found, again) for key in a.arrays())


def test_a_layers_errors_are_what_compare_reads_from_its_outputs_a_few_floats_a_sample():
    """A layer's graph copies the model's outputs (a recogniser's 68 MB a layer, 16 GB a lock in the cache): what is
    kept of it is each sample's error energy, dot product and energy, from which cosine and SNR are compare()'s."""
    from quantverdict.judge.compare import compare
    from quantverdict.judge.tolerances import Tolerance

    rng = np.random.default_rng(0)
    reference = {"y": rng.normal(size=(16, 40, 30)).astype(np.float32)}
    outputs = {"y": reference["y"] + rng.normal(0, 0.05, size=(16, 40, 30)).astype(np.float32)}
    errors = Errors.of(reference, outputs)
    assert {key: values.shape for key, values in errors.arrays().items()} == {
        "noise/y": (16,), "dot/y": (16,), "energy/y": (16,)}
    metrics = compare(reference, outputs, Tolerance(), False).metrics["y"]
    signal = signal_energy(reference["y"])
    assert errors.cosine("y", signal) == pytest.approx(metrics["cosine"], abs=1e-12)
    assert errors.snr_db("y", signal) == pytest.approx(metrics["snr_db"], abs=1e-9)
    assert Errors.from_arrays(errors.arrays()).arrays().keys() == errors.arrays().keys()


def test_a_workers_group_counts_the_outputs_its_layers_hold_until_it_ends(tmp_path, monkeypatch):
    """A worker's group of layers evaluated together holds each one's outputs until the group ends: outputs as large as
    its budget go one layer to a group, with the same results."""
    from quantverdict.judge import downstream

    store = Pipeline(tmp_path / "cache").store
    recipe = get_recipe("int8").with_options(fallback_layers=())
    layers = [node.name for node in weighted_layers(store, "resblock", recipe)]
    graphs, batches = store.precision_graph("resblock", recipe).layer_graphs(), store.batches("resblock", "calibration")
    sizes: list[int] = []
    evaluate = downstream.Group.evaluate

    def counted(group, *args):
        sizes.append(len(group.parts))
        return evaluate(group, *args)

    monkeypatch.setattr(downstream.Group, "evaluate", counted)
    together: dict[str, dict[str, np.ndarray]] = {}
    layers_alone.evaluate(graphs, layers, range(len(layers)), batches, 1 << 30,
                          lambda number, outputs: together.__setitem__(layers[number], outputs))
    assert sizes == [len(layers)] > [1]
    sizes.clear()
    alone: dict[str, dict[str, np.ndarray]] = {}
    layers_alone.evaluate(graphs, layers, range(len(layers)), batches, 1 << 30,
                          lambda number, outputs: alone.__setitem__(layers[number], outputs), output_bytes=1 << 30)
    assert sizes == [1] * len(layers)
    assert all(np.array_equal(together[layer][name], alone[layer][name]) for layer in layers for name in alone[layer])


def test_a_tied_weight_gets_a_copy_per_quantized_layer_that_onnx_runtime_fuses(tmp_path, monkeypatch):
    """Each quantized layer of a tied weight reads its own stored copy, scale and DequantizeLinear (a shared one made
    ONNX Runtime's x64 U8S8 rewrite fail: "Attempt to replace the existing tensor"), the integer-kernel session
    (optimisations on, session.x64quantprecision=1) loads the graph, and the case passes on any CPU with that setting."""
    import onnxruntime

    from quantverdict.run.cases import Case

    monkeypatch.setenv("QUANTVERDICT_ORT_X64_QUANT_PRECISION", "1")
    pipeline = Pipeline(tmp_path / "cache", manifest=_tied_weights(tmp_path))
    store = pipeline.store
    path = store.precision_onnx("tied", get_recipe("int8").configured({"gptq": True}))
    graph = onnx.load(str(path)).graph
    weights = {node.name: node.input[1] for node in graph.node if node.op_type in ("MatMul", "Gemm")}
    assert weights["first"] != weights["second"] and all(name.endswith("_dequantized") for name in weights.values())
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    batch = store.batches("tied", "calibration")[0]
    assert np.isfinite(session.run(["logits"], dict(batch))[0]).all()
    result = pipeline.run(Case("tied", "int8", "onnxruntime"))
    assert result.status == "passed", result.message


def test_the_cpus_are_shared_among_pytest_xdist_workers(monkeypatch):
    """Under ``pytest -n N`` each of the N processes may rank layers at once: each starts workers for its share of
    the CPUs, at least one, whatever the variable holds."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    alone = layers_alone.cpus_per_worker()
    for peers, share in [("2", max(1, alone // 2)), (str(alone * 4), 1), ("", alone), ("two", alone)]:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", peers)
        assert layers_alone.cpus_per_worker() == share


def _kill_first_worker(stop: threading.Event) -> None:
    """SIGKILL the first layers-alone worker this process starts, as the kernel's OOM killer does."""
    import os
    import signal

    while not stop.is_set():
        for proc in Path("/proc").iterdir():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) if proc.name.isdigit() else 0
                if parent != os.getpid():
                    continue
                if b"quantverdict.judge.layers_alone" in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
                    return
            except (OSError, IndexError, ValueError):
                continue
        stop.wait(0.01)


def test_a_worker_killed_for_memory_stops_the_search_naming_memory(tmp_path, monkeypatch):
    """A layers-alone worker the kernel kills (SIGKILL, the OOM killer's signal) is no technique that does not apply:
    the ranking fails naming memory, and the search fails with it rather than choose among fewer candidates; the case
    is one line and a record entry."""
    from quantverdict.run.cases import Case
    from test_recipe_search import MANIFEST, NETS

    if not Path("/proc/self/stat").exists():
        pytest.skip("finding the worker to kill reads /proc (Linux)")
    (tmp_path / "searchnets.py").write_text(NETS)
    ranked = "    build_files: []\n    recipe: {int8: {auto: true, max_fallback: 0.5}}\n  - name: block"  # dw's layers
    (tmp_path / "models.yaml").write_text(MANIFEST.replace("    build_files: []\n  - name: block", ranked))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(layers_alone, "cpus_per_worker", lambda: 2)
    monkeypatch.setattr(layers_alone, "LAYERS_PER_WORKER", 1)
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_worker, args=(stop,), daemon=True)
    killer.start()
    try:
        result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("dw", "int8", "onnxruntime"))
        assert not killer.is_alive()  # it found its worker
    finally:
        stop.set()
    assert result.status == "error" and "killed (SIGKILL; most likely out of memory" in result.message, result.message
    assert "the search stops here rather than choose among fewer candidates" in result.message
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")  # no worker killed: it searches again
    searched = pipeline.recipes.search("dw", "int8")
    assert searched is not None and searched.complete and not any(
        "worker" in (candidate.error or "") for candidate in searched.candidates)


PARENT = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; from quantverdict.judge.layers_alone import "
                          "die_with_parent; die_with_parent(int(sys.argv[1])); print(os.getpid(), flush=True); "
                          "time.sleep(120)", str(os.getpid())], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(120)
"""


def test_a_worker_is_the_out_of_memory_killers_first_choice_and_its_parent_is_not():
    """Where memory runs out, the kernel kills the process of highest ``oom_score``: a worker asks to be it (the run
    then says memory ran out, in one line and a record entry), the process it works for keeps its own score."""
    adjusted = Path("/proc/self/oom_score_adj")
    if not adjusted.exists():
        pytest.skip("oom_score_adj is Linux's")
    before = adjusted.read_text()
    said = subprocess.run([sys.executable, "-c", "import pathlib; from quantverdict.judge import layers_alone; "
                           "layers_alone.first_to_go(); print(pathlib.Path('/proc/self/oom_score_adj').read_text())"],
                          capture_output=True, text=True, check=True).stdout
    assert int(said) == 1000 and adjusted.read_text() == before


def test_a_worker_dies_with_its_parent_killed_alone_and_its_folder_is_swept_by_the_next_run(tmp_path):
    """CI's ``timeout`` signals the process, not its group: its layer workers must not go on computing, and the work
    folder it could not remove is removed by the next run (a live run's is left alone)."""
    import os
    import signal
    import tempfile
    import time

    from quantverdict.scratch import PREFIX, sweep_orphans

    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the worker outlived its parent by 10 s")
    orphan = Path(tempfile.mkdtemp(prefix=f"{PREFIX}layers-{parent.pid}-"))
    live = Path(tempfile.mkdtemp(prefix=f"{PREFIX}layers-{os.getpid()}-"))
    sweep_orphans("layers")
    assert not orphan.exists() and live.exists()
    live.rmdir()


@pytest.mark.parametrize("model,settings,kept_in", [("resblock", {"equalize": True}, "fp16"),
                                                    ("transformer-block", {"smoothquant": 0.5}, "fp8"),
                                                    ("cnn", {}, "fp32"), ("tied", {}, "fp8")])
def test_each_layer_kept_alone_in_a_wider_format_is_the_graph_its_recipe_makes(tmp_path, monkeypatch, model, settings,
                                                                               kept_in):
    """A layer alone in a wider format (nothing else quantized: fallback's choice of formats) is made from the whole
    recipe's preparation and calibration, the same bytes as its own recipe makes (FP8 at the opset its Q/DQ pairs
    need, from a graph written at 17), and its errors, evaluated from its cut in workers, are those of its own graph's
    outputs as written, up to the float kernels' rounding."""
    monkeypatch.setattr(layers_alone, "cpus_per_worker", lambda: 2)
    monkeypatch.setattr(layers_alone, "LAYERS_PER_WORKER", 1)
    store = Pipeline(tmp_path / "cache", manifest=_tied_weights(tmp_path) if model == "tied" else None).store
    recipe = get_recipe("int8").configured({"calibration": "max", **settings}).with_options(
        fallback_layers=(), layer_formats=(), only=())
    layers = [node.name for node in weighted_layers(store, model, recipe.with_options(only=None))]
    graphs = store.precision_graph(model, recipe.with_options(fallback_format=(kept_in,))).layer_graphs(kept_in)
    found = store.layers_alone_errors(model, recipe, layers, "calibration", kept_in)
    batches, reference = store.batches(model, "calibration"), store.fp32_outputs(model, "calibration")
    for layer, errors in zip(layers, found):
        own = recipe.with_options(fallback_layers=(layer,), fallback_format=(kept_in,))
        graph = store.precision_graph(model, own).make()
        assert graphs.graph(layer) == graph, layer
        assert_errors_agree(errors, Errors.of(reference, unkept_semantics(graph, batches, threads=1)), reference, layer)
