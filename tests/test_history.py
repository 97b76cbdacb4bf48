"""Regression policy over history: planted steps found at their run, no alarm on noise, one bad run
suspicious and two a regression; a real 20-run history on this machine."""
import json

import numpy as np
import pytest

from quantverdict.judge.changepoint import classify
from quantverdict.report.history import judge_history, load_policies
from quantverdict.report.schema import RunRecord
from quantverdict.run.cli import main

NIGHTLY_TIME = load_policies(None, "nightly")["time"]


def _series(rng, step, cv, n=60, at=30):
    values = 10.0 * (1 + cv * rng.standard_normal(n))
    values[at:] *= 1 + step
    return values


@pytest.mark.parametrize("step,cv,power", [(0.05, 0.01, 0.95), (0.05, 0.02, 0.95), (0.10, 0.01, 0.95),
                                           (0.10, 0.02, 0.95), (0.10, 0.05, 0.90)])
def test_planted_latency_steps_are_found_at_their_run(step, cv, power):
    rng = np.random.default_rng(7)
    verdicts = [classify(_series(rng, step, cv), NIGHTLY_TIME, higher_is_better=False) for _ in range(40)]
    found = [v.state == "regression" and abs(v.steps[-1].index - 30) <= 2 for v in verdicts]  # the run, ±2
    assert np.mean(found) >= power


def test_step_free_series_raise_no_regression():
    rng = np.random.default_rng(11)
    states = [classify(_series(rng, 0.0, cv), NIGHTLY_TIME, False).state
              for cv in (0.01, 0.02, 0.03, 0.05) for _ in range(50)]
    assert states.count("regression") == 0, {s: states.count(s) for s in set(states)}


def test_one_bad_run_is_suspicious_and_two_are_a_regression():
    rng = np.random.default_rng(3)
    values = _series(rng, 0.0, 0.02, n=30)
    one = values.copy()
    one[-1] *= 1.3
    two = values.copy()
    two[-2:] *= 1.3
    assert classify(one, NIGHTLY_TIME, False).state == "suspicious"
    assert classify(two, NIGHTLY_TIME, False).state == "regression"
    assert classify(values[:3], NIGHTLY_TIME, False).state == "insufficient data"
    assert classify(_series(rng, -0.2, 0.02), NIGHTLY_TIME, False).state == "improvement"


def test_a_real_history_with_a_slowdown_and_an_accuracy_change(tmp_path, monkeypatch):
    """20 runs of this harness on this machine: 20 ms slower per call from run 12, and INT8's last layer kept in
    FP32 from run 12 (+4 dB); both are found at run 12, nothing else moves. (A change of calibrator moved the MLP's
    SNR by 0.4 dB once; with ranges rounded to 8 bits max and MSE now differ by 0.02 dB: no step to find.)"""
    for run in range(1, 21):
        monkeypatch.setenv("QUANTVERDICT_BENCH_SLOWDOWN_MS", "20" if run >= 12 else "0")
        recipe = ["--recipe-option", "exclude=/4/*"] if run >= 12 else []
        code = main(["run", "--models", "mlp", "--precisions", "fp32,int8", "--backends", "onnxruntime", "--time",
                     *recipe, "--report-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache")])
        assert code == 0
    verdicts = {(v.case_id, v.metric): v.verdict for v in judge_history(tmp_path / "history.sqlite",
                                                                        load_policies(None, "nightly"))}
    latency = verdicts[("mlp-fp32-onnxruntime", "latency_ms")]
    assert latency.state == "regression" and latency.steps[-1].index == 11
    recipe = verdicts[("mlp-int8-onnxruntime", "recipe_snr_db")]
    assert recipe.state in ("regression", "improvement") and recipe.steps[-1].index == 11
    assert verdicts[("mlp-fp32-onnxruntime", "snr_db")].state == "stable"
    assert main(["history", "--history-db", str(tmp_path / "history.sqlite")]) == 1
    latest = max(tmp_path.glob("run-*.json"), key=lambda path: json.loads(path.read_text())["started"])
    assert main(["report", str(latest)]) == 0  # the run's page carries its runner class's history
    page = latest.with_suffix(".html").read_text()
    changes = page[page.index("What changed since the last good run"):]
    changes = changes[:changes.index("</table>")]
    assert "<td>regression</td><td>mlp-fp32-onnxruntime</td><td>latency_ms</td>" in changes
    assert "<td>mlp-int8-onnxruntime</td><td>recipe_snr_db</td>" in changes
    assert "<td>mlp-fp32-onnxruntime</td><td>snr_db</td>" not in changes


def _typed(record: dict) -> RunRecord:
    """A hand-made record with what the schema requires and it leaves out (a duration, each case's coordinates)."""
    cases = [{"model": "m", "precision": "fp32", "backend": "onnxruntime", **case} for case in record["cases"]]
    return RunRecord.model_validate({"schema_version": 1, "duration_s": 1.0, **record, "cases": cases})


def _record(run: int, latency: float, runner_class: str, torch_version: str) -> dict:
    case = {"id": "cnn-fp32-onnxruntime", "status": "passed",
            "metrics": {"latency": {"median_ms": latency, "items_per_s": 8 / latency}}}
    return {"run_id": f"{runner_class}-{run}", "started": f"2026-10-{run:02d}T02:00:00",
            "environment": {"runner_class": runner_class, "git_commit": f"{run:02d}" + "c" * 38,
                            "packages": {"torch": torch_version, "numpy": "2.3.0"}},
            "cases": [case]}


def _slowed_at_night_20(tmp_path, rng, runner_class: str, beside=None):
    """28 nights of one runner class whose latency steps up 15% from night 20, when torch changed (and, each night,
    ``beside(night)``'s record too)."""
    from quantverdict.report.history import append

    db = tmp_path / "history.sqlite"
    for run in range(1, 29):
        slow = run >= 20
        append(db, _typed(_record(run, 10 * (1.15 if slow else 1) * (1 + 0.01 * rng.standard_normal()),
                                  runner_class, "2.14.1" if slow else "2.14.0")))
        if beside is not None:
            append(db, _typed(beside(run)))
    return db


def test_the_history_page_shows_what_changed_since_the_last_good_run(tmp_path):
    """Two runner classes, 28 nights; on one of them latency steps up 15% from night 20, when torch
    changed: the page's table names night 19 as the last good run, the commits and the torch change,
    and the chart of that series is labelled with its runner class; the other class stays stable."""
    from quantverdict.report.history_page import history_section

    rng = np.random.default_rng(5)
    db = _slowed_at_night_20(tmp_path, rng, "x86_64-avx512-vnni",
                             lambda run: _record(run, 20 * (1 + 0.01 * rng.standard_normal()), "x86_64-avx2", "2.14.0"))
    verdicts = judge_history(db, load_policies(None, "nightly"))
    states = {(v.runner_class, v.metric): v.verdict.state for v in verdicts}
    assert states[("x86_64-avx512-vnni", "latency_ms")] == "regression"
    assert states[("x86_64-avx2", "latency_ms")] == "stable"
    section = history_section(db, verdicts)
    table = section[section.index("What changed since the last good run"):section.index("</table>")]
    assert "2026-10-19T02:00 (19cccccccc)" in table and "2026-10-28T02:00 (28cccccccc)" in table
    assert "torch 2.14.0→2.14.1" in table and "numpy" not in table
    assert table.count("<tr class=") == 2  # latency and throughput of the slowed class, nothing else
    assert section.count("<img") == 2 and "2 stable series not drawn" in section
    only_avx2 = history_section(db, verdicts, runner_class="x86_64-avx2")
    assert "Nothing: no series" in only_avx2 and "<img" not in only_avx2
    assert main(["history", "--history-db", str(db), "--page", str(tmp_path / "history.html"), "--all"]) == 1
    assert (tmp_path / "history.html").read_text().count("<img") == 4


def test_a_hand_edited_history_is_judged_on_the_rows_that_are_measurements(tmp_path):
    """Strings and NULLs where values were, and package lists that are no JSON (a traceback before): those rows are
    no measurement and are left out; the rest is judged and drawn."""
    import sqlite3

    from quantverdict.report.history import append, series

    db = tmp_path / "history.sqlite"
    for run in range(1, 13):
        append(db, _typed(_record(run, 10.0 + 0.01 * run, "x86_64-avx2", "2.14.0")))
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE points SET value = 'fast' WHERE rowid IN (SELECT rowid FROM points LIMIT 2)")
        connection.execute("UPDATE points SET value = NULL WHERE rowid IN (SELECT rowid FROM points LIMIT 2 OFFSET 4)")
        connection.execute("UPDATE runs SET packages = '{torch: broken'")
    assert main(["history", "--history-db", str(db), "--page", str(tmp_path / "history.html"), "--all"]) in (0, 1)
    counts = [len(one.values) for one in series(db)]
    assert counts and sum(counts) == 2 * 12 - 4


def test_a_case_judged_in_one_run_and_not_in_the_next_fails_the_history(tmp_path):
    """Skipped or errored where the run before judged it, or absent from a whole run after the whole run before judged
    it: one line each and exit 1, though every series is stable; a shard that holds part of the matrix is no evidence
    of absence, and a case skipped in both runs is no change."""
    from quantverdict.report.history import append, unjudged

    db = tmp_path / "history.sqlite"
    for run in range(1, 13):
        record = _record(run, 10.0, "x86_64-avx2", "2.14.0")
        record["cases"] += [{**record["cases"][0], "id": name} for name in ("b", "c", "d")]
        record["cases"].append({"id": "e", "status": "skipped", "message": "no GPU", "metrics": {}})
        append(db, _typed(record))
    assert unjudged(db) == []
    assert main(["history", "--history-db", str(db)]) == 0
    last = _record(13, 10.0, "x86_64-avx2", "2.14.0")
    last["cases"] += [{"id": "b", "status": "skipped", "message": "onnxruntime missing", "metrics": {}},
                      {"id": "c", "status": "error", "message": "worker crashed", "metrics": {}},
                      {"id": "e", "status": "skipped", "message": "no GPU", "metrics": {}}]
    append(db, _typed(last))
    lines = unjudged(db)
    assert [line.split()[:2] for line in lines] == [["unjudged", "b"], ["unjudged", "c"], ["missing", "d"]]
    assert "skipped in run x86_64-avx2-13, passed in run x86_64-avx2-12" in lines[0]
    assert main(["history", "--history-db", str(db)]) == 1
    assert main(["history", "--history-db", str(db), "--profile", "premerge"]) == 1  # whatever the profile
    shard = _record(14, 10.0, "x86_64-avx2", "2.14.0")
    shard["shard"] = {"index": 1, "count": 2}
    append(db, _typed(shard))
    assert [line.split()[:2] for line in unjudged(db)] == [["unjudged", "b"], ["unjudged", "c"], ["missing", "d"]]


def test_runs_are_ordered_by_their_utc_instant_and_a_run_without_a_start_time_is_refused(tmp_path):
    """A runner on UTC, then one of the same class on New York time a minute later that no longer judges a case: by
    the local text the later run sorted first and nothing was missing (exit 0); by the instant, the case is missing."""
    import sqlite3

    from quantverdict.report.history import append, unjudged

    db = tmp_path / "history.sqlite"
    first = _record(1, 10.0, "x86_64-avx2", "2.14.0")
    first["cases"].append({**first["cases"][0], "id": "b"})
    first["started"] = "2026-11-26T12:00:00+0000"
    later = _record(2, 10.0, "x86_64-avx2", "2.14.0")
    later["started"] = "2026-11-26T07:01:00-0500"  # 12:01 UTC
    append(db, _typed(first))
    append(db, _typed(later))
    assert [line.split()[:2] for line in unjudged(db)] == [["missing", "b"]]
    assert main(["history", "--history-db", str(db)]) == 1
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE runs SET started = NULL WHERE run_id = 'x86_64-avx2-1'")
    assert main(["history", "--history-db", str(db)]) == 2


def test_a_history_from_before_statuses_says_its_completeness_is_unchecked(tmp_path, capsys):
    import sqlite3

    from quantverdict.report.history import append

    db = tmp_path / "history.sqlite"
    for run in range(1, 4):
        append(db, _typed(_record(run, 10.0, "x86_64-avx2", "2.14.0")))
    with sqlite3.connect(db) as connection:
        connection.execute("DROP TABLE statuses")
        connection.execute("DROP TABLE whole_runs")
    assert main(["history", "--history-db", str(db)]) == 0
    assert "unchecked         completeness: this history was written before" in capsys.readouterr().out


def test_the_history_command_says_what_moved_since_the_last_good_run(tmp_path, capsys):
    """A regression's line is followed by what moved since its last good run: the packages and the commits."""
    db = _slowed_at_night_20(tmp_path, np.random.default_rng(7), "x86_64-avx2")
    assert main(["history", "--history-db", str(db)]) == 1
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("regression") and "latency_ms" in line)
    assert out[at + 1] == "  since run x86_64-avx2-19: packages changed: torch 2.14.0→2.14.1; commit " \
                          "19cccccccccc → 28cccccccccc", out[at:at + 2]


def test_a_history_another_process_holds_is_said_so_not_to_be_moved_aside(tmp_path, monkeypatch):
    """A history database locked by another run (a nightly writing it) is not corrupt: the line says to run again when
    that one is done, where it once advised moving the database aside (losing the history)."""
    import sqlite3

    from quantverdict.report import history
    from quantverdict.report.record import DestinationError, check_destinations

    db = tmp_path / "history.sqlite"
    history.open_history(db).close()
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    connect = sqlite3.connect
    monkeypatch.setattr(history.sqlite3, "connect", lambda path, timeout=0.0: connect(path, timeout=0.2))
    try:
        with pytest.raises(DestinationError, match="another process holds it: run again when it is done") as raised:
            check_destinations(tmp_path / "reports", db)
        assert "move it aside" not in str(raised.value)
    finally:
        holder.rollback()
        holder.close()
