"""The pytest plugin as a user meets it: a temporary repository with a model package and a manifest and
no test code, run by pytest in a subprocess (the plugin comes from the installed entry point)."""
import json
import subprocess
import sys

import pytest

from user_repo import MANIFEST, MODEL


@pytest.fixture
def user_repo(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> pytest.Pytester:
    """A repository holding only a model package, a manifest and the setting naming it."""
    pytester.mkpydir("tinymodels")
    (pytester.path / "tinymodels" / "nets.py").write_text(MODEL)
    (pytester.path / "models.yaml").write_text(MANIFEST)
    cache = tmp_path_factory.getbasetemp() / "plugin-cache"  # shared by these tests: the tiny model once
    (pytester.path / "pyproject.toml").write_text(f'[tool.quantverdict]\nmanifest = "models.yaml"\n'
                                                  f'cache-dir = "{cache}"\n')
    return pytester


def _run(repo: pytest.Pytester, *args: str) -> pytest.RunResult:
    return repo.runpytest_subprocess("-p", "no:cacheprovider", "-rs", *args, timeout=600)


def test_a_repository_with_only_a_manifest_runs_exactly_its_own_int8_cases(user_repo):
    result = _run(user_repo, "-m", "int8", "--collect-only", "-q")
    collected = [line for line in result.outlines if "::" in line]
    backends = ("onnxruntime", "tensorrt", "tensorrt_rtx", "torch_quant")  # those that offer INT8
    assert collected == [f"models.yaml::tiny-int8-{backend}" for backend in backends]
    result = _run(user_repo, "-m", "int8")
    outcomes = result.parseoutcomes()
    [record_path] = (user_repo.path / "reports").glob("run-*.json")
    record = json.loads(record_path.read_text())
    assert {case["id"] for case in record["cases"]} == {f"tiny-int8-{backend}" for backend in backends}
    statuses = {case["backend"]: case["status"] for case in record["cases"]}
    assert statuses["onnxruntime"] == "passed" and set(statuses.values()) <= {"passed", "skipped"}, statuses
    # what else runs depends on the runner (a GPU runs torch_quant's case up to its coverage rule)
    assert result.ret == 0 and {k: v for k, v in outcomes.items() if k in ("passed", "skipped")} == \
        record["summary"], result.stdout.str()[-3000:]


def test_built_in_models_run_only_when_asked_for(user_repo):
    assert "cnn-int8-onnxruntime" not in _run(user_repo, "--collect-only", "-q").stdout.str()
    asked = _run(user_repo, "--collect-only", "-q", "--qv-models", "cnn", "--qv-precisions", "int8")
    assert [line for line in asked.outlines if "::" in line][0] == "models.yaml::cnn-int8-onnxruntime"


def test_the_manifest_can_be_named_in_pytest_ini_instead(pytester):
    pytester.mkpydir("tinymodels")
    (pytester.path / "tinymodels" / "nets.py").write_text(MODEL)
    (pytester.path / "config").mkdir()
    (pytester.path / "config" / "models.yaml").write_text(MANIFEST)
    pytester.makeini("[pytest]\nqv_manifest = config/models.yaml\n")
    result = _run(pytester, "--collect-only", "-q", "-m", "fp32 and onnxruntime")
    assert "config/models.yaml::tiny-fp32-onnxruntime" in result.stdout.str()


def test_a_misspelled_manifest_field_is_a_usage_error_of_one_line(user_repo):
    (user_repo.path / "models.yaml").write_text(MANIFEST.replace("range:", "rnage:"))
    result = _run(user_repo, "-m", "int8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == [f"ERROR: quantverdict: {user_repo.path / 'models.yaml'}: model 'tiny': "
                      "models[0].inputs[0].rnage: unknown field 'rnage'; did you mean 'range'? "
                      "(allowed: name, shape, dtype, range, dynamic_axes, resolution, value)"], result.errlines
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_failing_calibration_callable_is_named_with_its_trace(user_repo):
    (user_repo.path / "models.yaml").write_text(MANIFEST.replace("nets:calibration", "nets:broken_calibration"))
    result = _run(user_repo, "-m", "int8 and onnxruntime")
    text = result.stdout.str()
    assert result.ret == 1
    assert "model 'tiny': its calibration callable tinymodels.nets:broken_calibration failed: KeyError: 'scale'" in text
    assert 'tinymodels/nets.py", line 19, in broken_calibration' in text  # the user's own frame
    assert "quantverdict/run" not in text.split("broken_calibration failed")[1]  # no harness frames above it
    [record_path] = (user_repo.path / "reports").glob("run-*.json")
    [case] = json.loads(record_path.read_text())["cases"]
    assert case["status"] == "error" and 'line 19, in broken_calibration' in case["trace"]


def test_a_case_expected_to_miss_its_bound_xfails_but_one_that_crashes_still_fails(user_repo):
    """``xfail(raises=CaseFailed)`` is how a repository declares a known miss: it covers a verdict, never a crash."""
    user_repo.makeconftest("""
        import pytest
        from quantverdict.run.pytest_plugin import CaseFailed

        def pytest_collection_modifyitems(items):
            for item in items:
                item.add_marker(pytest.mark.xfail(strict=True, raises=CaseFailed, reason="known miss"))
    """)
    strict = MANIFEST + "    tolerances: {int8: {min_cosine: 0.99999999}}\n"
    (user_repo.path / "models.yaml").write_text(strict)
    missed = _run(user_repo, "-m", "int8 and onnxruntime")
    assert missed.ret == 0 and missed.parseoutcomes()["xfailed"] == 1, missed.stdout.str()[-2000:]
    (user_repo.path / "models.yaml").write_text(strict.replace("nets:calibration", "nets:broken_calibration"))
    crashed = _run(user_repo, "-m", "int8 and onnxruntime")
    assert crashed.ret == 1 and crashed.parseoutcomes()["failed"] == 1, crashed.stdout.str()[-2000:]


def test_the_quantverdict_fixture_judges_a_users_own_outputs(user_repo):
    user_repo.makepyfile(test_engine="""
        import numpy as np
        import pytest


        def test_close_outputs_pass(quantverdict):
            reference = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)
            comparison = quantverdict.check(reference, reference * 1.001, "int8", name="my-engine",
                                            task="classification")
            assert comparison.passed


        def test_wrong_outputs_fail_with_the_bound(quantverdict):
            reference = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)
            with pytest.raises(AssertionError, match="cosine .* must be ≥ 0.99"):
                quantverdict.check(reference, -reference, "int8", name="my-engine")
        """)
    result = _run(user_repo, "test_engine.py")
    assert result.ret == 0, result.stdout.str()[-3000:]
    [record_path] = (user_repo.path / "reports").glob("run-*.json")
    statuses = sorted(case["status"] for case in json.loads(record_path.read_text())["cases"])
    assert statuses == ["failed", "passed"]


def test_an_unconfigured_repository_is_left_alone(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = _run(pytester)
    assert result.ret == 0 and result.parseoutcomes() == {"passed": 1}
    assert not (pytester.path / "reports").exists()


def test_a_manifest_no_setting_names_is_pointed_out_when_nothing_ran(pytester):
    (pytester.path / "models.yaml").write_text(MANIFEST)
    result = _run(pytester, "-m", "int8")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["quantverdict: models.yaml is not named as the manifest, so none of its cases ran: "
                                 "run `quantverdict init` * or pass --qv-manifest=models.yaml"])


def test_an_option_value_after_a_space_does_not_lose_the_project_settings(user_repo, tmp_path):
    """pytest takes the value of a plugin's option given after a space for a path when it picks its root
    directory (before plugins' options are known); the project's settings are still found from the
    working directory, and the option still applies."""
    cache = tmp_path / "elsewhere"
    cache.mkdir()
    result = _run(user_repo, "-m", "int8 and onnxruntime", "--qv-cache-dir", str(cache))
    assert result.ret == 0 and result.parseoutcomes()["passed"] == 1, result.stdout.str()[-2000:]
    assert (cache / "calibration").is_dir()


def test_a_precision_that_is_none_and_an_unconfigured_repository_are_said_not_silent(tmp_path):
    """``pytest -m int9`` deselected everything (exit 5, no word); in a repository with no manifest, ``pytest -m
    int8`` collected nothing and said nothing."""
    (tmp_path / "test_nothing.py").write_text("")

    def pytest_in(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    typo = pytest_in("-m", "int9")
    assert typo.returncode == 4 and "quantverdict: -m names no precision 'int9'; did you mean 'int8'?" in typo.stderr
    bare = pytest_in("-m", "int8")
    assert bare.returncode == 5 and "no manifest is configured here" in bare.stdout and "quantverdict init" in \
        bare.stdout, bare.stdout
