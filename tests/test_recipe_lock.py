"""The recipe lock: ``quantverdict lock`` writes each searched recipe once, runs apply it with no search, a changed
graph keeps it with a note, a lock that names layers the graph lacks or settings no recipe takes is one line, a
nightly ``--check`` proposes a better recipe beside the lock, and a search stopped by the wall-time limit is never
locked. Real searches on small networks, in a repository of the test's own."""
import json
import math
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from quantverdict.errors import HarnessError
from quantverdict.precision.matrix_device import matrix_key
from quantverdict.run.cli import main
from quantverdict.run.pipeline import Case, Pipeline
from quantverdict.tune import rules
from quantverdict.tune.lock import RecipeLock
from user_repo import written
from test_recipe_search import MANIFEST, NETS


@pytest.fixture
def repo(tmp_path, monkeypatch):
    return written(tmp_path, monkeypatch, {"searchnets.py": NETS, "models.yaml": MANIFEST})


def _lock(repo, *extra: str, cache: str = "cache") -> int:
    return main(["lock", "--manifest", "models.yaml", "--models", "dw", "--precisions", "int8", "--cache-dir", cache,
                 *extra])


def _weights_changed(repo) -> None:
    """``changednets:dw_changed``: the same network after a training step, its weights moved."""
    (repo / "changednets.py").write_text(textwrap.dedent("""\
        import torch

        from searchnets import dw


        def dw_changed():
            net = dw()
            with torch.no_grad():
                next(net.parameters()).mul_(1.01)
            return net
        """))


def test_lock_writes_the_searched_recipe_with_its_evidence_and_shows_progress_as_it_searches(repo, capsys):
    assert _lock(repo) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines()  # each candidate as it ends (not one still working on a slow runner)
             if line.startswith("recipe search dw int8:") and "still judging after" not in line]
    assert lines[0].startswith("recipe search dw int8: at most ") and "folds of 16 calibration samples" in lines[0]
    assert lines[0].endswith(f"; GPTQ's matrix work on {matrix_key()}")  # GPTQ is among its stages
    assert len(lines) >= 10 and all("best so far" in line and "s left" in line for line in lines[1:-1])
    assert all("taken: " in line for line in lines[1:-1] if " dB in " in line)  # and why it is taken, or not
    assert "CPU-s, peak memory" in lines[-1]  # and, at its end, what it took
    text = (repo / "quantverdict.lock").read_text()
    assert text.startswith("# quantverdict recipe lock") and "lock: " in out
    entry = yaml.safe_load(text)["recipes"]["dw"]["int8"]
    search = Pipeline(repo / "cache", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert search is not None and search.complete and entry["settings"] == search.chosen.to_dict()
    assert [c["settings"] for c in entry["search"]["candidates"]] == [c.settings.to_dict() for c in search.candidates]
    assert entry["search"]["held_out_samples"] == 16 and entry["chosen_by"]["runner_class"]
    assert "note" not in entry["search"] and "beyond" not in entry["search"]  # the choice meets the bounds
    passed_if = entry["search"]["passed_if"]  # what a candidate's `passed: true` met, as its comparison checked it
    assert any(bound.startswith("logits: cosine ≥ 0.") for bound in passed_if), passed_if
    assert len(entry["graph_sha256"]) == 64 and len(entry["calibration_data"]) == 64
    assert list(entry) == ["settings", "float_layers", "graph_sha256", "calibration_data", "qdq_sha256", "chosen_by",
                           "search"]
    assert RecipeLock.read(repo / "quantverdict.lock").text() == text  # read back as written: a stable diff
    assert _lock(repo) == 0 and "dw int8: locked {" in capsys.readouterr().out  # kept, not searched again
    assert _lock(repo, "--update", "dw") == 0 and "(unchanged)" in capsys.readouterr().out  # searched: the same choice
    assert _lock(repo, "--update", "nope") == 2 and "nope" in capsys.readouterr().err


def test_a_locked_run_searches_nothing_and_builds_the_locked_recipe(repo):
    assert _lock(repo) == 0
    locked = yaml.safe_load((repo / "quantverdict.lock").read_text())["recipes"]["dw"]["int8"]["settings"]
    searches = []
    pipeline = Pipeline(repo / "fresh-cache", manifest=repo / "models.yaml", lock=repo / "quantverdict.lock",
                        progress=searches.append)
    result = pipeline.run(Case("dw", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    assert searches == [] and not (repo / "fresh-cache" / "recipe-search").exists()
    assert "search" not in result.metrics["recipe"] and result.metrics["recipe"]["lock"]["current_graph"] is True
    assert result.metrics["recipe"]["lock"]["same_qdq_graph"] is True  # built again from nothing: the same bytes
    for key, value in locked.items():
        recorded = result.metrics["recipe"]["settings"][key]
        assert recorded == value or recorded == {"method": value}


def test_a_changed_graph_keeps_its_locked_recipe_and_the_verdict_says_so(repo, capsys):
    assert _lock(repo) == 0
    _weights_changed(repo)
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    pipeline = Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=repo / "quantverdict.lock")
    assert pipeline.recipes.search("dw", "int8") is None
    result = pipeline.run(Case("dw", "int8", "onnxruntime"))
    assert "recipe" in result.metrics, result.message
    assert result.metrics["recipe"]["lock"]["current_graph"] is False
    assert "recipe locked for an earlier graph (sha256 " in result.message
    assert "quantverdict lock --update dw" in result.message
    code = main(["run", "--manifest", "models.yaml", "--models", "dw", "--precisions", "int8", "--backends",
                 "onnxruntime", "--cache-dir", "cache", "--report-dir", "reports"])
    assert code == 0 and "dw int8: recipe locked for an earlier graph" in capsys.readouterr().out
    from quantverdict.report.load import load_record
    from quantverdict.report.render import markdown

    summary = markdown(load_record(next((repo / "reports").glob("run-*.json"))))  # not the terminal's alone
    assert "## Locks that do not match this run" in summary and "- dw int8: recipe locked for an earlier graph" in summary


def test_an_edited_calibration_key_in_the_lock_names_that_key_alone(repo):
    """Only the calibration data's key moved (edited in the lock): the note names that key, then and now, and not the
    graph's hash twice, as it once did."""
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    text = path.read_text()
    locked = yaml.safe_load(text)["recipes"]["dw"]["int8"]["calibration_data"]
    path.write_text(text.replace(locked, "a" * 64))
    pipeline = Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path)
    result = pipeline.run(Case("dw", "int8", "onnxruntime"))
    lock = result.metrics["recipe"]["lock"]
    assert lock["current_graph"] is True and lock["current_calibration"] is False
    assert f"recipe locked for an earlier calibration data (key aaaaaaaaaaaa, now {locked[:12]})" in lock["note"]
    assert "graph (sha256" not in lock["note"]


def test_a_lock_naming_layers_the_graph_lacks_or_settings_no_recipe_takes_is_one_line(repo):
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    document = yaml.safe_load(path.read_text())
    entry = document["recipes"]["dw"]["int8"]
    entry["settings"]["fallback"], entry["float_layers"] = 0.1, ["/gone/Conv"]
    path.write_text(yaml.safe_dump(document))
    result = Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path).run(Case("dw", "int8", "onnxruntime"))
    assert result.status == "error"
    assert "float_layers: ['/gone/Conv'] are not layers of 'dw''s graph" in result.message
    assert "quantverdict lock --update dw" in result.message
    entry["settings"]["smoothquant"] = "banana"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(HarnessError) as caught:
        Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path)
    [line] = str(caught.value).splitlines()
    assert line.startswith(f"{path}: recipes.dw.int8.settings: ") and "smoothquant" in line


def test_the_nightly_check_proposes_a_better_recipe_beside_the_lock_and_keeps_a_good_one(repo, capsys):
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    assert _lock(repo, "--check") == 0 and "the lock holds" in capsys.readouterr().out
    assert not path.with_name("quantverdict.lock.proposed").exists()
    document = yaml.safe_load(path.read_text())
    chosen = document["recipes"]["dw"]["int8"]["settings"]
    worst = min((c for c in document["recipes"]["dw"]["int8"]["search"]["candidates"] if c["score_db"] is not None),
                key=lambda c: c["score_db"])
    assert worst["settings"] != chosen
    document["recipes"]["dw"]["int8"]["settings"] = worst["settings"]
    path.write_text(yaml.safe_dump(document))
    before = path.read_text()
    assert _lock(repo, "--check") == 3
    out = capsys.readouterr().out
    assert "beats the locked" in out and "dB of SNR on 16 held-out samples" in out
    proposed = yaml.safe_load(path.with_name("quantverdict.lock.proposed").read_text())
    assert proposed["recipes"]["dw"]["int8"]["settings"] == chosen and path.read_text() == before


def test_a_search_stopped_by_the_wall_time_limit_is_never_locked(repo, capsys):
    code = main(["lock", "--manifest", "models.yaml", "--models", "block", "--precisions", "int8", "--cache-dir",
                 "cache"])
    assert code == 1 and not (repo / "quantverdict.lock").exists()
    assert "model 'block' int8: not locked: stopped at the wall-time limit of 0 s" in capsys.readouterr().err


def test_a_run_that_searched_says_how_to_lock_and_a_ci_log_gets_a_line_per_case(repo):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "quantverdict", "run", "--manifest", "models.yaml", "--models", "dw",
                           "--precisions", "fp32,int8", "--backends", "onnxruntime", "--cache-dir", "cache",
                           "--report-dir", "reports"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[1/2] dw-fp32-onnxruntime: passed" in proc.stderr and "[2/2] dw-int8-onnxruntime: passed" in proc.stderr
    assert "recipe search dw int8: at most" in proc.stderr
    assert "recipes chosen by a search, not a lock (dw): lock them" in proc.stdout
    [record] = (repo / "reports").glob("run-*.json")
    search = json.loads(record.read_text())["cases"][1]["metrics"]["recipe"]["search"]
    assert search["complete"] is True and search["incumbent"] is None


def test_under_pytest_the_search_shows_progress_and_a_committed_lock_runs_no_search(repo):
    import subprocess
    import sys

    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "int8", "--qv-manifest=models.yaml",
               "--qv-models=dw", "--qv-backends=onnxruntime", "--qv-cache-dir=cache", "--qv-report-dir=reports"]
    first = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "quantverdict: recipe search dw int8: at most" in first.stdout
    assert "quantverdict: recipes chosen by a search, not a lock (dw): lock them" in first.stdout
    assert _lock(repo) == 0
    second = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "1 passed" in second.stdout, second.stdout[-3000:]
    assert "recipe search" not in second.stdout + second.stderr and "lock them" not in second.stdout


PORTABLE_SCRIPT = textwrap.dedent("""\
    import json, sys
    from pathlib import Path
    from quantverdict.hashing import file_sha256
    from quantverdict.run.pipeline import Pipeline

    digests = {}
    for model in ("r", "t"):
        for settings in json.loads(sys.argv[2]):
            pipeline = Pipeline(Path(sys.argv[1]), manifest=Path("models.yaml"), recipe_settings={"int8": settings})
            recipe = pipeline.recipes.recipe(model, "int8", "emulated")
            digests[f"{model} {json.dumps(settings)}"] = file_sha256(pipeline.store.precision_onnx(model, recipe))
    print(json.dumps(digests))
    """)


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                    reason="emulating another CPU's kernels needs qemu-user (apt-get install qemu-user; .ci/run does)")
def test_the_same_recipe_builds_the_same_qdq_bytes_under_another_cpus_kernels(tmp_path, qv_pipeline):
    """A lock is one recipe for every runner only if every runner builds the same graph from it. Under QEMU's Nehalem
    (SSE4.2: ONNX Runtime's SSE kernels, no AVX, no FMA, no F16C) calibration, SmoothQuant, equalization, GPTQ and
    fallback's ranking (its layers kept in FP16) give the same Q/DQ bytes as this CPU's kernels, for a residual CNN
    and a transformer block: before ranges were rounded to RANGE_BITS, 45 of 64 such graphs differed (every scale
    moved in its last bits)."""
    import subprocess
    import sys

    for name, model in (("r", "resblock"), ("t", "transformer-block")):
        (tmp_path / f"{name}.onnx").write_bytes(qv_pipeline.store.fp32_onnx(model).read_bytes())
    (tmp_path / "models.yaml").write_text(textwrap.dedent("""\
        models:
          - {name: r, onnx: r.onnx, inputs: [{name: input, shape: [4, 3, 32, 32], range: [-1, 1]}], outputs: [logits],
             task: classification, calibration: synthetic}
          - {name: t, onnx: t.onnx, inputs: [{name: tokens, shape: [4, 16, 64], range: [-1, 1]}], outputs: [hidden],
             calibration: synthetic}
        """))
    (tmp_path / "build.py").write_text(PORTABLE_SCRIPT)
    settings = json.dumps([{"calibration": "max"}, {"calibration": "percentile"}, {"smoothquant": 0.5},
                           {"equalize": True}, {"gptq": True}, {"fallback": 0.5, "fallback_format": "fp16"}])
    here, there = (json.loads(subprocess.run([*prefix, sys.executable, "build.py", cache, settings], cwd=tmp_path,
                                             capture_output=True, text=True, timeout=1200, check=True).stdout)
                   for prefix, cache in (([], "native"), (["qemu-x86_64", "-cpu", "Nehalem"], "emulated")))
    assert len(here) == 12 and here == there


def test_a_lock_whose_choice_misses_the_bounds_says_what_they_would_take(repo):
    """Bounds no recipe meets: the lock keeps the search's note (the layers in FP32 tried past max_fallback, and that
    they missed too) and those tries, read back as written: the reviewer sees what a stricter target costs."""
    (repo / "models.yaml").write_text(MANIFEST.replace(
        "    task: classification\n", "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1))
    assert _lock(repo) == 0
    text = (repo / "quantverdict.lock").read_text()
    search = yaml.safe_load(text)["recipes"]["dw"]["int8"]["search"]
    assert search["note"].startswith("the choice misses the case's bounds on held-out calibration samples")
    assert search["beyond"] and all(c["passed"] is False and c["settings"]["fallback"] > 0.1 for c in search["beyond"])
    assert RecipeLock.read(repo / "quantverdict.lock").text() == text


def test_the_nightly_check_after_a_weight_change_judges_the_lock_and_its_nearest_alternatives_first(repo, capsys):
    """After a training step moved the weights, the check judges the locked recipe and the two alternatives its search
    ranked next, and searches no wider where the lock's recipe still meets the bounds and neither does better (three
    candidates, where a search judges ten); where it misses the bounds, the search runs as before."""
    assert _lock(repo) == 0
    capsys.readouterr()
    locked = yaml.safe_load((repo / "quantverdict.lock").read_text())["recipes"]["dw"]["int8"]
    _weights_changed(repo)
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    assert _lock(repo, "--check") == 3  # the lock holds, for an earlier graph: a whole lock naming this one proposed
    out, err = capsys.readouterr()
    assert "its entry names an earlier graph or calibration set: the proposed lock names these" in out
    proposed = yaml.safe_load((repo / "quantverdict.lock.proposed").read_text())["recipes"]["dw"]["int8"]
    assert proposed["settings"] == locked["settings"] and proposed["float_layers"] == locked["float_layers"]
    assert proposed["graph_sha256"] != locked["graph_sha256"]
    lines = [line for line in err.splitlines()  # each candidate as it ends (not one still working on a slow runner)
             if line.startswith("recipe search dw int8:") and "still judging after" not in line]
    assert "checking the lock first" in lines[0] and not any("at most" in line for line in lines)
    assert [line.split(":")[1].split()[0] for line in lines[1:-1]] == ["1/3", "2/3", "3/3"], lines
    assert re.fullmatch(r"recipe search dw int8: \d+ s, \d+ CPU-s, peak memory \d+\.\d GB.*", lines[-1])  # its cost
    assert "the lock holds" in out
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed").replace(
        "    task: classification\n", "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1))
    _lock(repo, "--check")
    err = capsys.readouterr().err
    assert "the lock's recipe misses the case's bounds on held-out samples: searching" in err
    assert "recipe search dw int8: at most " in err  # the search ran


def test_the_nightly_check_stops_an_alternative_once_it_cannot_beat_the_lock(repo, capsys, monkeypatch):
    """An alternative races the lock's recipe as a search's candidates race the best before them: where the lock's
    recipe meets the case's bounds, one that can no longer be better stops after the fold that shows it (here every
    one is out of reach at once) and is never proposed; judged to the end, the same alternatives are (REACH_SE ∞)."""
    assert _lock(repo) == 0
    _weights_changed(repo)
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    capsys.readouterr()
    monkeypatch.setattr(rules, "REACH_SE", -math.inf)
    assert _lock(repo, "--check", cache="raced") == 3  # it holds, for the graph it names now
    out, err = capsys.readouterr()
    assert "1/3" in err and err.count("on 1 of 4 folds, out of reach") == 2 and "the lock holds" in out
    monkeypatch.setattr(rules, "REACH_SE", math.inf)
    _lock(repo, "--check", cache="full")
    assert "out of reach" not in capsys.readouterr().err


def test_a_lock_that_missed_the_bounds_when_locked_is_not_searched_again_for_missing_them(repo, capsys):
    """A lock whose search found no recipe meeting the case's bounds: after a weight change its recipe misses them
    again, which is no news, so the check judges it and its nearest alternatives and searches no wider."""
    tight = MANIFEST.replace("    task: classification\n",
                             "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1)
    (repo / "models.yaml").write_text(tight)
    _lock(repo)
    entry = yaml.safe_load((repo / "quantverdict.lock").read_text())["recipes"]["dw"]["int8"]
    assert not next(c for c in entry["search"]["candidates"] if c["settings"] == entry["settings"])["passed"]
    capsys.readouterr()
    _weights_changed(repo)
    (repo / "models.yaml").write_text(tight.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    assert _lock(repo, "--check") == 3  # it holds; the proposed lock names the graph it now holds for
    out, err = capsys.readouterr()
    assert "checking the lock first" in err and "at most" not in err and "3/3" in err
    assert "the lock holds" in out and "it misses the case's bounds there, as it did when locked" in out


def test_two_writers_of_one_lock_keep_both_entries_and_a_dangling_link_is_not_written_through(repo, tmp_path,
                                                                                             capsys):
    """Two ``lock`` processes (one per model) each read the file, then write it: the second writer re-reads it under
    an exclusive lock and merges its own entries in, where it dropped the first's."""
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    first, second = RecipeLock.read(path), RecipeLock.read(path)  # both read before either writes
    entry = first.get("dw", "int8")
    first.put("alpha", "int8", entry)
    second.put("beta", "fp8", entry)
    beside = set(repo.iterdir())
    first.write()
    second.write()
    recipes = RecipeLock.read(path).recipes
    assert set(recipes) == {"dw", "alpha", "beta"} and set(recipes["beta"]) == {"fp8"}
    assert set(repo.iterdir()) == beside  # the writers locked its folder: no guard file left beside it
    assert _lock(repo) == 0  # entries of models no manifest declares are kept, and said
    assert "alpha: locked, but no model of that name is declared or registered" in capsys.readouterr().out
    link = repo / "linked.lock"
    link.symlink_to(tmp_path / "elsewhere" / "nothing.lock")
    with pytest.raises(HarnessError, match="it is a link to .*nothing.lock, which does not exist"):
        RecipeLock(link).write()
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_a_lock_or_manifest_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path, special):
    import os

    from quantverdict.documents import DocumentError
    from quantverdict.run.manifest import load_manifest

    path = {"/dev/zero": Path("/dev/zero"), "fifo": tmp_path / "pipe", "folder": tmp_path}[special]
    if special == "fifo":
        os.mkfifo(path)
    for read in (RecipeLock.read, load_manifest):
        with pytest.raises(DocumentError, match="not a regular file"):
            read(path)


def test_the_lock_says_why_each_candidate_was_taken_or_not(repo):
    """A choice at a lower SNR than another candidate reads as a mistake without the rule beside it: each
    candidate judged carries whether it was taken over the best before it, with the paired gain and what it needed."""
    assert _lock(repo) == 0
    candidates = yaml.safe_load((repo / "quantverdict.lock").read_text())["recipes"]["dw"]["int8"]["search"][
        "candidates"]
    whys = [candidate.get("why") for candidate in candidates if not candidate.get("error")]
    assert whys[0] == "taken: the first judged, the one the others must beat"
    assert all(why and why.startswith(("taken: ", "not taken: ")) for why in whys), whys
    assert any("dB per sample over the best before it" in why and "standard errors of the gains paired by sample"
               in why for why in whys[1:]), whys


def test_a_quoted_version_says_to_write_it_unquoted(tmp_path):
    from quantverdict.documents import DocumentError

    (tmp_path / "quantverdict.lock").write_text('version: "1"\nrecipes: {}\n')
    with pytest.raises(DocumentError, match="version: '1' is a string: write it unquoted, 1$"):
        RecipeLock.read(tmp_path / "quantverdict.lock")


RUN_DW = ["run", "--manifest", "models.yaml", "--models", "dw", "--precisions", "int8", "--backends", "onnxruntime",
          "--cache-dir", "cache"]


def _record(repo, name: str):
    return next((repo / name).glob("run-*.json"))


def _recipe_snr(path) -> float:
    from quantverdict.report.load import load_record

    return load_record(path).cases[0].metrics.recipe.measured().snr_db


def _why_every_change_regresses(repo, capsys) -> tuple[int, list[str]]:
    """The gate of the ``after`` run against ``before`` under a policy that makes any SNR change a regression: its exit
    code and the lines saying why dw's INT8 case regressed (what moved)."""
    (repo / "strict.yaml").write_text("defaults: {max_snr_drop_db: -1000}\n")
    capsys.readouterr()
    code = main(["gate", "--baseline", str(_record(repo, "before")), "--current", str(_record(repo, "after")),
                 "--gate-policy", "strict.yaml"])
    return code, [line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("why: dw-int8-onnxruntime: ")]


def _explained(repo, capsys, baseline, current, gap: float, *extra: str) -> tuple[int, str]:
    """``explain`` of ``current`` against ``baseline`` under a policy at half their measured SNR ``gap``: its exit code
    and what it printed."""
    (repo / "policy.yaml").write_text(f"defaults: {{max_snr_drop_db: {gap / 2}}}\n")
    capsys.readouterr()
    code = main(["explain", "--baseline", str(baseline), "--current", str(current), "--gate-policy", "policy.yaml",
                 "--manifest", "models.yaml", "--cache-dir", "cache", *extra])
    return code, capsys.readouterr().out


def test_a_weight_change_under_a_lock_is_attributed_to_the_graph_not_the_recipe(repo, capsys):
    """Two real runs with the lock, the second after a training step: under a policy that makes any SNR change a
    regression, the gate says the FP32 graph moved (and the precision graph built from it), not the recipe settings."""
    assert _lock(repo) == 0
    assert main([*RUN_DW, "--report-dir", "before"]) == 0
    _weights_changed(repo)
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    main([*RUN_DW, "--report-dir", "after"])
    code, why = _why_every_change_regresses(repo, capsys)
    assert code == 1 and why and "the FP32 graph" in why[0] and "recipe settings" not in why[0], why
    # explain: the better run as the baseline, a policy at half their gap; the baseline's FP32 graph is still in the
    # cache, so the case runs again on it with the current recipe settings, and that restores the verdict
    runs = sorted((_recipe_snr(path), path) for path in (_record(repo, "before"), _record(repo, "after")))
    (low, worse), (high, better) = runs
    if high - low < 0.02:
        pytest.skip(f"the weight change moved INT8's SNR by {high - low:.3f} dB here: no regression to explain")
    code, out = _explained(repo, capsys, better, worse, high - low)
    assert code == 0 and "on the baseline's graph (found in the cache) restore it: the graph change caused it" in out, \
        out
    shutil.rmtree(repo / "cache" / "normalised")  # the baseline's graph gone: nothing to swap back
    code, out = _explained(repo, capsys, better, worse, high - low)
    assert code == 1 and "untested here: no swap reproduces what moved" in out, out


def test_a_lock_whose_precision_graph_this_runner_builds_otherwise_says_so(repo):
    """An edited (or another version's) qdq_sha256 was recorded as same_qdq_graph false and said nowhere."""
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    path.write_text(re.sub(r"qdq_sha256: [0-9a-f]{64}", "qdq_sha256: " + "f" * 64, path.read_text()))
    result = Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path).run(Case("dw", "int8", "onnxruntime"))
    lock = result.metrics["recipe"]["lock"]
    assert lock["same_qdq_graph"] is False and "this runner built a precision graph other than the lock's" in \
        lock["note"] and "locked ffffffffffff" in result.message, result.message
    assert "matrix work" not in lock["note"]  # no GPTQ: the device moves nothing


def test_a_gptq_lock_made_on_another_matrix_device_says_so_where_this_runner_builds_otherwise(repo, monkeypatch):
    """GPTQ's H and rounding move in their last bits with the device they ran on: a lock whose GPTQ ran on a GPU,
    built on a runner whose runs on its CPU, names both where the graphs differ (a lock before the device was recorded:
    the CPU)."""
    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    text = re.sub(r"qdq_sha256: [0-9a-f]{64}", "qdq_sha256: " + "f" * 64, path.read_text())
    text = text.replace("settings: {", "settings: {gptq: true, ", 1)
    monkeypatch.setenv("QUANTVERDICT_MATRIX_DEVICE", "cpu")
    messages = {}
    for device in (None, "cuda NVIDIA H100 80GB HBM3"):
        edited = text if device is None else text.replace("chosen_by: {", f"chosen_by: {{matrix_device: {device}, ")
        path.write_text(edited)
        result = Pipeline(repo / "cache", manifest=repo / "models.yaml", lock=path).run(
            Case("dw", "int8", "onnxruntime"))
        messages[device] = result.metrics["recipe"]["lock"]["note"]
    assert "matrix work" not in messages[None]
    assert "GPTQ's matrix work on cuda NVIDIA H100 80GB HBM3 then and on cpu here (QUANTVERDICT_MATRIX_DEVICE)" in \
        messages["cuda NVIDIA H100 80GB HBM3"], messages


def test_explain_names_the_recipe_when_the_baselines_recipe_restores_the_verdict(repo, capsys):
    """Two real runs of one graph with two recipe settings; the worse one regresses under a policy set at half their
    measured gap: what moved is the recipe, and running the case again with the baseline's settings restores it."""
    records = {}
    for name, option in (("max", "calibration=max"), ("mse", "calibration=mse")):
        main([*RUN_DW, "--report-dir", name, "--recipe-option", option])
        records[name] = _record(repo, name), _recipe_snr(_record(repo, name))
    (better, high), (worse, low) = sorted(records.values(), key=lambda pair: -pair[1])
    if high - low < 0.02:
        pytest.skip(f"the two calibrations score within 0.02 dB here ({high:.3f}, {low:.3f}): no regression to explain")
    code, out = _explained(repo, capsys, better, worse, high - low, "--case", "dw-int8-onnxruntime")
    assert code == 0 and "dw-int8-onnxruntime: moved: the recipe settings" in out, out
    assert "on this graph restore it: the recipe change caused it" in out, out


def test_a_lock_update_under_review_is_attributed_to_the_recipe_not_the_graph(repo, capsys):
    """Two real runs with the lock, the second after a reviewed edit of the lock's calibrator (what a lock update
    brings): the gate says the recipe settings moved (and the precision graph built from them), not the FP32 graph."""
    assert _lock(repo) == 0
    assert main([*RUN_DW, "--report-dir", "before"]) == 0
    path = repo / "quantverdict.lock"
    chosen = re.search(r"settings: \{calibration: (\w+)", path.read_text()).group(1)
    other = "max" if chosen != "max" else "mse"
    text = path.read_text()
    path.write_text(text.replace(f"settings: {{calibration: {chosen}", f"settings: {{calibration: {other}", 1))
    main([*RUN_DW, "--report-dir", "after"])
    code, why = _why_every_change_regresses(repo, capsys)
    assert code == 1 and why and "the recipe settings" in why[0] and "the FP32 graph" not in why[0], why


def test_explain_names_the_cause_among_two_that_moved_by_re_running_each_swap(repo, capsys):
    """The weights moved (a training step) and the recipe stopped keeping the two most sensitive layers in FP32: two
    runs that differ in both. The gate names both; explain re-runs the case with each swapped back and names the one
    whose swap restores the verdict (the recipe), and says that the other's does not (the graph)."""
    assert main([*RUN_DW, "--report-dir", "before", "--recipe-option", "calibration=max", "--recipe-option",
                 "exclude=/0/Conv;/11/Gemm"]) in (0, 1)
    _weights_changed(repo)
    (repo / "models.yaml").write_text(MANIFEST.replace("build: searchnets:dw", "build: changednets:dw_changed"))
    assert main([*RUN_DW, "--report-dir", "after", "--recipe-option", "calibration=max"]) in (0, 1)
    before, after = _record(repo, "before"), _record(repo, "after")
    high, low = _recipe_snr(before), _recipe_snr(after)
    if high - low < 3:
        pytest.skip(f"the layers kept gain {high - low:.2f} dB on dw here: too little to tell the causes apart")
    code, out = _explained(repo, capsys, before, after, high - low)
    assert "moved: " in out and "the FP32 graph" in out and "the recipe settings" in out, out
    assert code == 0 and "restore it: the recipe change caused it" in out, out
    assert "on the baseline's graph (found in the cache) do not restore it" in out and "not the graph change" in out


def test_near_valid_locks_are_read_or_refused_in_one_line_never_crash_the_reader(repo):
    """Hypothesis replaces values anywhere in a lock the search wrote (nulls, NaN, numbers of 400 digits, strings,
    nested values), as a hand edit or a merge tool gets a lock almost right: reading it either takes the file or
    refuses it with a HarnessError whose every line names the file; nothing else escapes."""
    import yaml
    from hypothesis import given, settings

    from near_valid import changes, mutated
    from quantverdict.errors import HarnessError
    from quantverdict.tune.lock import RecipeLock

    assert _lock(repo) == 0
    path = repo / "quantverdict.lock"
    original = yaml.safe_load(path.read_text())

    @settings(max_examples=80, deadline=None, derandomize=True)
    @given(changes())
    def check(edits):
        path.write_text(yaml.safe_dump(mutated(original, edits)))
        try:
            RecipeLock.read(path)
        except HarnessError as exc:
            lines = str(exc).splitlines()
            assert lines and all(str(path) in line for line in lines), str(exc)

    check()
