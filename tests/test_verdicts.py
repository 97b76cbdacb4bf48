"""Recipe accuracy apart from runtime fidelity, the runner class, baselines, and bounds the
evaluation sets can resolve."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.judge.mutations import Mutation
from quantverdict.models import BUILTIN
from quantverdict.report.gate import gate, load_policy
from quantverdict.report.load import load_record
from quantverdict.run.cases import Case
from quantverdict.run.mutate import mutated
from quantverdict.run.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_a_quantized_case_has_a_recipe_verdict_and_a_fidelity_verdict(qv_pipeline):
    result = qv_pipeline.run(Case("digits-cnn", "int8", "onnxruntime"))
    metrics = result.metrics
    assert result.status == "passed", result.message
    assert metrics["recipe"]["passed"] and "Q/DQ as written" in metrics["recipe"]["evaluator"]
    fidelity = metrics["fidelity"]
    assert fidelity["passed"] and "onnxruntime" in fidelity["runtime"] and fidelity["device"]
    assert 0 <= fidelity["outputs"][0]["flip_fraction"] <= fidelity["outputs"][0]["bound"]
    assert metrics["recipe"]["coverage"]["layers"] == metrics["recipe"]["coverage"]["quantized"] == 4
    drop = metrics["task"]["intervals"]["accuracy_drop_points"]
    assert drop["low"] <= metrics["task"]["accuracy_drop_points"] <= drop["high"]
    assert "cosine" in metrics["metrics"]["logits"]["intervals"]


def test_the_record_names_the_cpu_its_instruction_sets_and_the_runner_class(qv_pipeline):
    env = qv_pipeline.caps.to_dict()
    assert env["cpu"]["logical_cpus"] >= 1 and env["cpu"]["isa_class"] in env["runner_class"]
    assert ("avx2" in env["cpu"]["isa"]) == ("avx2" in open("/proc/cpuinfo").read())


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or os.uname().machine != "x86_64",
                    reason="CPUID is an x86-64 instruction; /proc/cpuinfo is Linux's")
def test_cpuid_run_here_agrees_with_the_kernels_flags_on_bare_hardware():
    """What the process executes CPUID for is what the kernel lists, when no emulator stands between them (under
    QEMU they differ, and CPUID is the one that is right: the AVX2-emulation test below relies on it)."""
    from quantverdict.cpuid import FLAGS, cpuid_flags

    listed = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split()
    assert cpuid_flags() == {flag: flag in listed for flag in FLAGS}


@pytest.mark.int8
def test_a_defect_in_the_graph_is_blamed_on_the_recipe(qv_pipeline):
    mutant = mutated(qv_pipeline, Mutation("clipped_range", "first", {"factor": 0.05}))
    result = mutant.run(Case("cnn", "int8", "onnxruntime"))
    assert result.status == "failed" and "the recipe regressed" in result.message
    assert not result.metrics["recipe"]["passed"] and result.metrics["fidelity"]["passed"]
    assert "first diverging layer" in result.message


@pytest.mark.int8
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                    reason="emulating an AVX2-only CPU needs qemu-user (apt-get install qemu-user; .ci/run does)")
def test_on_an_avx2_only_cpu_the_runtime_is_blamed_and_the_harness_setting_agrees_with_vnni(qv_pipeline, tmp_path):
    """The whole harness, real ONNX Runtime and torch, on an emulated Haswell (AVX2, no VNNI). With ONNX
    Runtime's default kernels the transformer block's INT8 case fails as a runtime divergence (the recipe
    passes); with the harness's default setting it passes, as on a VNNI machine."""
    model = "transformer-block"
    qv_pipeline.run(Case(model, "int8", "onnxruntime"))  # export and calibrate outside the emulator
    command = ["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-m", "quantverdict", "run", "--models", model,
               "--precisions", "int8", "--backends", "onnxruntime", "--cache-dir", str(qv_pipeline.cache.root)]
    started = {setting: subprocess.Popen([*command, "--report-dir", str(tmp_path / setting)], cwd=REPO, text=True,
                                         env={**os.environ, "QUANTVERDICT_ORT_X64_QUANT_PRECISION": setting},
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for setting in ("0", "auto")}  # side by side: each spends seconds importing under emulation
    runs = {}
    for setting, process in started.items():
        stdout, stderr = process.communicate(timeout=1200)
        runs[setting] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    deployed, harness_default = runs["0"], runs["auto"]
    assert deployed.returncode == 1, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    for words in ("runtime diverges from the graph", "no VNNI", "the recipe itself is within its tolerance",
                  "first diverging node: /attn/"):
        assert words in deployed.stdout, (words, deployed.stdout[-3000:])
    assert harness_default.returncode == 0, harness_default.stdout[-3000:] + harness_default.stderr[-3000:]
    [record] = (tmp_path / "auto").glob("run-*.json")
    environment = json.loads(record.read_text())["environment"]
    assert environment["runner_class"].startswith("x86_64 avx2;") and "avx512f" not in environment["cpu"]["isa"]


def _record(pipeline: Pipeline, cases: list[Case], path: Path, runner_class: str | None = None) -> Path:
    from quantverdict.report.record import build_record

    record = build_record([pipeline.run(c).to_dict() for c in cases], pipeline.caps, 0.0)
    if runner_class:
        record["environment"]["runner_class"] = runner_class
    path.write_text(json.dumps(record, default=str))
    return path


@pytest.mark.int8
def test_pytest_baseline_catches_what_the_tolerance_table_lets_through(qv_pipeline, tmp_path):
    """A DQ scale (1 + ε)× its Q's scales everything after it by 1 + ε: max_norm_err ≈ ε (0.1: 0.4 of the
    0.25 bound, on any runner), cosine unchanged, yet the recipe's SNR falls ~21 dB (41.5 → 20.0 dB measured),
    7× the gate's 3 dB rule: the absolute bounds pass it, the baseline fails it, in the case itself."""
    case = Case("digits-cnn", "int8", "onnxruntime")
    baseline = _record(qv_pipeline, [case], tmp_path / "base.json")
    defect = Mutation("qdq_mismatch", "middle", {"factor": 1.1})
    assert mutated(qv_pipeline, defect).run(case).status == "passed"  # the table alone misses it
    judged = mutated(Pipeline(qv_pipeline.cache.root, baseline=baseline), defect)
    result = judged.run(case)
    assert result.status == "failed" and "regressed against baseline" in result.message
    assert any("recipe SNR" in line for line in result.metrics["baseline"]["regressions"])


@pytest.mark.int8
def test_pytest_option_baseline_fails_the_test_of_the_regressed_case(qv_pipeline, tmp_path):
    case = Case("cnn", "int8", "onnxruntime")
    record = json.loads(_record(qv_pipeline, [case], tmp_path / "base.json").read_text())
    record["cases"][0]["metrics"]["recipe"]["metrics"]["logits"]["snr_db"] += 10  # the baseline was better
    (tmp_path / "base.json").write_text(json.dumps(record))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "fixtures/models.yaml",
                          "--qv-models", "cnn", "--qv-precisions", "int8", "--qv-backends", "onnxruntime",
                          "--qv-baseline", str(tmp_path / "base.json"), "--qv-report-dir", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "regressed against baseline" in run.stdout and "recipe SNR" in run.stdout
    assert "cnn-int8-onnxruntime: moved: nothing the records hold" in run.stdout  # the baseline was edited, not rerun
    from quantverdict.report.render import html_page, markdown

    summary = markdown(load_record(next(tmp_path.glob("run-*.json"))))
    assert "## Regressions against the baseline" in summary and "- cnn-int8-onnxruntime: " in summary
    page = html_page(load_record(next(tmp_path.glob("run-*.json"))), [])  # the page's row names what moved too
    assert "<h2>Regressions against the baseline</h2>" in page
    assert "<td>cnn-int8-onnxruntime</td>" in page and "moved: nothing the records hold" in page


@pytest.mark.int8
def test_gate_compares_runtimes_only_within_a_runner_class(qv_pipeline, tmp_path):
    case = Case("cnn", "int8", "onnxruntime")
    base = load_record(_record(qv_pipeline, [case], tmp_path / "a.json", "x86_64 avx2; no GPU"))
    current = base.model_copy(deep=True)
    current.environment.runner_class = "x86_64 avx512_vnni; no GPU"
    current.cases[0].metrics.metrics["logits"].snr_db -= 10  # the runtime differs on another CPU
    result = gate(base, current, load_policy(None))
    assert result.exit_code == 0 and "not compared across runner classes" in result.notes[0]
    current.cases[0].metrics.recipe.metrics["logits"].snr_db -= 10  # the recipe itself got worse
    assert gate(base, current, load_policy(None)).exit_code == 1


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda s: s.name)
def test_builtin_evaluation_sets_resolve_every_bound(spec, qv_pipeline):
    """No bound of the tolerance table is finer than the built-ins' evaluation sets can resolve."""
    batches = qv_pipeline.store.eval_batches(spec.name)
    samples = sum(len(next(iter(b.values()))) for b in batches)
    labelled = spec.eval_data is not None
    if spec.task != "classification" and not labelled:
        return
    assert samples >= qv_pipeline.tolerances.samples_to_resolve(spec.name, spec.tolerances, labelled)


@pytest.mark.fp16
def test_an_fp16_overflow_is_reported_as_one_naming_the_layer(tmp_path):
    """A layer whose FP32 output exceeds FP16's largest finite value (an FFN output of 87,189 in a trained T5
    encoder) is infinite in FP16: the failure says overflow first, naming the tensor, its node and the value,
    instead of metrics of a collapsed output; the run's progress says so as each diagnosis starts (a large network's
    take minutes)."""
    (tmp_path / "hot.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef net():\n    torch.manual_seed(0)\n"
        "    first, second = nn.Linear(8, 16), nn.Linear(16, 4)\n"
        "    with torch.no_grad():\n        first.weight.mul_(3e5)\n        second.weight.mul_(1e-5)\n"
        "    return nn.Sequential(first, nn.ReLU(), second).eval()\n")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: hot\n    build: hot:net\n    inputs: [{name: x, shape: [4, 8]}]\n    outputs: [y]\n"
        "    calibration: synthetic\n")
    said: list[str] = []
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml", progress=said.append).run(
        Case("hot", "fp16", "onnxruntime"))
    assert result.status == "failed"
    assert said == ["hot-fp16-onnxruntime: finding which tensors overflow FP16 and which of them break the output",
                    "hot-fp16-onnxruntime: finding the first layer where the recipe's graph leaves FP32's"]
    lines = result.message.splitlines()
    assert lines[0].startswith("hot-fp16-onnxruntime: overflow: ") and "cures the output" in lines[0]
    assert "FP16's largest finite value 65,504" in lines[0]
    assert lines[1].startswith("  keep /0/Gemm (Gemm) in FP32: its output '/0/Gemm_output_0' reaches ")
    assert result.metrics["overflow"]["value"] > 65504 and result.metrics["overflow"]["op"] == "Gemm"


T5_LIKE = """\
import torch
from torch import nn


class Encoder(nn.Module):
    \"\"\"Attention with a mask added as mask × float32's lowest (as T5 does), then an FFN whose hidden activation
    exceeds FP16's range (a trained T5's reached 87,189).\"\"\"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)
        with torch.no_grad():
            self.up.weight.mul_(3e5)
            self.down.weight.mul_(1e-5)

    def forward(self, x, mask):
        keep = torch.cat([torch.ones_like(mask[:, :1]), mask[:, 1:]], dim=1)  # no row wholly masked
        bias = (1.0 - keep)[:, None, :] * torch.finfo(torch.float32).min
        scores = self.q(x) @ self.k(x).transpose(1, 2) / 8 ** 0.5 + bias
        hidden = torch.softmax(scores, dim=-1) @ self.v(x)
        return self.down(torch.relu(self.up(hidden)))


def net():
    return Encoder().eval()
"""


@pytest.mark.fp16
def test_an_fp16_collapse_names_the_activation_that_breaks_the_output_not_the_mask(tmp_path):
    """Both the mask's minus infinity and an FFN activation exceed FP16's range, the mask first; stored in FP16
    alone the mask changes nothing (the Softmax gives 0 either way), the FFN activation breaks the output: the
    failure names the FFN's nodes to keep, checked, and lists the mask as a mask."""
    (tmp_path / "t5like.py").write_text(T5_LIKE)
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: t5like\n    build: t5like:net\n    inputs: [{name: x, shape: [2, 6, 8]}, "
        "{name: mask, shape: [2, 6], dtype: int64, range: [0, 2]}]\n    outputs: [y]\n    calibration: synthetic\n")
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("t5like", "fp16", "onnxruntime"))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0].startswith("t5like-fp16-onnxruntime: overflow: ") and "cures the output" in lines[0], lines[0]
    assert lines[1].startswith("  keep /up/Gemm (Gemm) in FP32: ") or lines[1].startswith("  keep /up/MatMul (MatMul)")
    overflow = result.metrics["overflow"]
    masks = [entry for entry in overflow["all"] if entry["mask"]]
    assert masks and not any(entry["breaks_output"] for entry in masks)
    assert not {entry["tensor"] for entry in masks} & set(overflow["cure"]["tensors"])
    assert any("a mask's minus infinity before a Softmax; stored in FP16 alone, the output holds" in line
               for line in lines[1:])
