"""A recipe chosen for each model (``recipe: auto``), on held-out calibration data, by a fixed amount of work.

A fixed recipe is tuned for the networks it was chosen on; a network nobody tuned for gets whatever that
recipe happens to do to it. The search here tries the techniques the harness has, in stages as Intel
Neural Compressor's basic strategy and NNCF's accuracy control do: first the calibrator (max,
percentile, MSE), then each stage's alternatives on top of the best so far, kept only where they help (the case's
own bounds first, a worst sample's among them, lower bounds by the evaluation's margin: :func:`better`):
the migration of scale between activations and weights (SmoothQuant at two strengths, or equalization),
fallback of the most sensitive layers to a wider format up to the declared share (spent whole where it helps, as Model
Optimizer's ``auto_quantize`` spends its budget), each layer in the narrowest of ``wider_formats`` that holds it (FP16,
as Model Optimizer keeps its unquantized layers, since TensorRT runs them faster than FP32 and their rounding is ~8 bits
finer than INT8's, FP32 where FP16 does not hold; FP8 too where the user offers it:
:mod:`quantverdict.precision.wider_layers`), and weight rounding (GPTQ); see :func:`quantverdict.tune.stages.stages`.

Every candidate is judged by cross-validation over the calibration set: calibrated on three quarters,
judged on the quarter left out (its graph's exact semantics against FP32), once per quarter, so every
calibration sample is judged once by a recipe that never saw it. The evaluation set, on which the case is
judged afterwards, is never seen. ``folds`` are those split views
(:class:`quantverdict.tune.folds.HeldOut`). The chosen settings are then applied with the whole
calibration set like any hand-set recipe.

The layers a fallback candidate keeps wider are ranked for each fold on the samples that fold calibrates on
(:func:`quantverdict.tune.fallback.fallback_per_part`), so fallback is judged on samples that did not choose its
layers (ranked once on the first fold, three folds of four judged layers their own samples had ranked). Each layer
quantized alone is evaluated once, on the whole calibration set, for every fold's ranking and the final recipe's. The
calibrators tried again at the end are judged at the layers the fallback stage ranked (compared at equal layers, as a
nightly check compares the lock's alternatives), not ranked again for each calibration.

The search's work is fixed: every candidate of every stage, each on every fold, so a slow runner and a fast one
choose among the same candidates. Wall time (``budget_s``) only stops a search that runs away; one so stopped is
recorded as incomplete (:attr:`SearchResult.complete`), and a lock file never takes it. Each candidate is reported as
it ends (``progress``): a first search takes minutes.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from quantverdict.errors import CalibrationError, HarnessError, ResourceError, UserCodeError
from quantverdict.judge.by_kind import ByKind
from quantverdict.judge.compare import judge_task_metrics
from quantverdict.judge.layers_alone import worker_count
from quantverdict.judge.output_kinds import measured_output
from quantverdict.judge.sensitivity import weighted_layers
from quantverdict.judge.workbench import Workbench
from quantverdict.models.spec import sample_count
from quantverdict.precision.applies import changes_nothing
from quantverdict.precision.matrix_device import matrix_key
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.riders import spent
from quantverdict.precision.settings import Formats, RecipeSettings
from quantverdict.resources import available_memory
from quantverdict.tune.auto import AutoSettings
from quantverdict.tune.beyond import beyond_note, beyond_plan, fewest_in_float
from quantverdict.tune.fallback import choose_fallback, fallback_per_part, ranking_pass_s
from quantverdict.tune.margin import short_of_margin
from quantverdict.heartbeat import heartbeat
from quantverdict.tune.progress import ranking_seconds, time_left, upcoming
from quantverdict.tune.result import Candidate, SearchResult
from quantverdict.tune.rules import (MIN_GAIN_DB, REACH_SE, better, out_of_reach, pooled_snr_db, sample_noise,
                                     weighed)
from quantverdict.tune.stages import CALIBRATORS, stages

LOG = logging.getLogger(__name__)
Progress = Callable[[str], None]  # told one line as a search starts and as each candidate ends


class Trials:
    """A search's candidates judged: each calibrated on every fold's calibration part and judged on its held-out part
    (``folds``: views of ``whole`` whose ``evaluation`` data is the part of the calibration set their ``calibration``
    leaves out, ``held_out`` its samples' indices in ``whole``'s calibration set), pooled, against the FP32 graph's
    outputs there; each reported as it ends, with the time the ones ahead take."""

    def __init__(self, whole: Workbench, folds: Sequence[Workbench], held_out: Sequence[np.ndarray], model: str,
                 base: QDQ, judging: ByKind, report: Progress):
        self.whole, self.folds, self.held_out, self.model, self.base = whole, folds, held_out, model, base
        self.judging, self.tolerance, self.report = judging, judging.tolerance, report
        self.spec, self.output = folds[0].spec(model), measured_output(folds[0], model)  # the output it scores
        self.references = {name: np.concatenate([fold.fp32_outputs(model, "evaluation")[name] for fold in folds])
                           for name in self.spec.outputs}
        self.scored = judging.scored(self.output, self.references[self.output])  # what a score reads of the output
        self.scored_reference = self.scored(self.references[self.output])
        self.evaluation = sum(sample_count(batch) for batch in whole.batches(model, "evaluation"))
        self.done, self.planned = 0, 0  # candidates judged, and the most the search may judge: for progress lines
        self.layers = len(weighted_layers(folds[0], model, base))  # those a fallback share is counted of
        graph_bytes = folds[0].fp32_onnx(model).stat().st_size  # about the prepared graph's: what workers hold
        self.workers = worker_count(graph_bytes, self.layers)
        self._ranking: float | None = None  # a ranking's seconds, once asked
        self.started, self.slowest, self.ridden = time.monotonic(), 0.0, 0.0  # ridden: the first's riders' seconds
        self.per_fold: dict[RecipeSettings, list[Mapping[str, str]]] = {}  # each fallback candidate's layers by fold
        self.passed_if: list[str] = []  # the bounds a candidate that ``passed`` met, as its comparison checked them

    def ranking(self) -> float:
        """About how long ranking the layers alone takes (:func:`ranking_seconds`), one batch's pass timed once."""
        if self._ranking is None:
            self._ranking = ranking_seconds(self.layers, self.workers, ranking_pass_s(self.whole, self.model))
        return self._ranking

    @property
    def samples(self) -> int:
        return len(self.references[self.output])

    def in_time(self, budget_s: float) -> bool:
        """Whether one more candidate, as slow as the slowest so far, still ends within ``budget_s``."""
        return time.monotonic() - self.started + self.slowest <= budget_s

    def meets_bounds(self, pooled: dict[str, np.ndarray]) -> bool:
        """The case's bounds on the held-out samples, each output under its kind's as the verdict judges it
        (:class:`ByKind`), its lower bounds by the evaluation's margin (:mod:`quantverdict.tune.margin`), and those on
        its task metrics (an embedding's worst sentence, a detector's worst image), with no labels (the calibration set
        has none)."""
        met, self.passed_if = self._bounds(pooled)
        return met

    def cannot_meet_bounds(self, pooled: dict[str, np.ndarray]) -> bool:
        """Whether the outputs of the held-out samples judged so far (``pooled``, the first of every output's, as
        :meth:`_judged` pairs them with the references) miss the case's bounds whatever the samples not yet judged
        give: they miss them with each of those reproduced exactly (its FP32 outputs), the most a sample can add to a
        metric of fidelity."""
        completed = {name: np.concatenate([values, self.references[name][len(values):]])
                     for name, values in pooled.items()}
        return not self._bounds(completed)[0]

    def _bounds(self, pooled: dict[str, np.ndarray]) -> tuple[bool, list[str]]:
        """:meth:`meets_bounds`'s answer, and the bounds as its comparison checked them."""
        spec, tolerance = self.spec, self.tolerance
        judged = self.judging.compare(self.references, pooled)
        if spec.task_metric() is not None and (tolerance.task_min or tolerance.task_max):
            judge_task_metrics(spec.call("metric", self.references, pooled, None), tolerance, judged,
                               spec.describe("metric"))
        return (judged.passed and not short_of_margin(judged.metrics, tolerance, self.evaluation),
                [check.requirement() for check in judged.checks])

    def judge(self, settings: RecipeSettings, ahead: list[RecipeSettings], among: Sequence[Candidate] = (),
              kept: Sequence[Mapping[str, str]] | None = None, rival: tuple[Candidate, np.ndarray] | None = None,
              decide: bool = False, maybe: int = 0) -> tuple[Candidate, np.ndarray | None]:
        """``settings`` judged (a fold's graph is not kept): its held-out samples' error energies (None where the
        technique does not apply to this graph, or it stopped short), reported beside the best of the search's
        candidates ``among`` and the time the candidates ``ahead`` take, priced by those. ``kept``: the layers its
        fallback keeps wider on each fold, as a lock names them or another candidate's ranking chose them (else
        ranked on each fold). ``rival``: the candidate it must be :func:`better` than, and its samples' error energies;
        the candidate stops after the first fold that puts it :func:`out_of_reach` where that one meets the case's
        bounds, or where neither can meet them (:meth:`cannot_meet_bounds`): only the SNR can then make it better
        (a candidate that may still meet bounds its rival misses is judged on every fold). ``decide``:
        whether it is taken over ``rival`` (or is the first) is decided, and its line says why. ``maybe``: how many of
        ``ahead``, the last, are tried only where the first of the search past ``max_fallback`` meets the bounds."""
        begun, riding, candidate = time.perf_counter(), spent(), Candidate(settings=settings)
        title = f"recipe search {self.model} {self.base.name}: {self.done + 1}/{self.planned} {settings.words()}"
        with heartbeat(lambda seconds: self.report(f"{title}: still judging after {seconds:.0f} s")):
            candidate, samples, pooled = self._judged(candidate, kept, rival)
        if candidate.folds is not None:
            samples = None
        elif samples is not None:  # the user's metric is the user's code: its failure is not the technique's
            candidate.passed = self.meets_bounds(pooled)
        candidate.seconds = round(time.perf_counter() - begun, 3)
        self.slowest = max(self.slowest, candidate.seconds)
        if not self.done:  # what its calibration pass measured for the others (first_pass)
            self.ridden = spent() - riding
        self.done += 1
        stopped = f" on {candidate.folds} of {len(self.folds)} folds, out of reach" if candidate.folds else ""
        if decide and samples is not None:
            candidate.taken, candidate.why = weighed(samples, rival[1] if rival else None, candidate.passed,
                                                     rival[0].passed if rival else None)
        # the search's choice after this one where it decides (a taken candidate may score lower pooled than one not
        # taken: the rule is per sample), else the highest score judged to the end
        chosen = candidate if candidate.taken else rival[0] if decide and rival is not None else None
        leader = chosen.score_db if chosen is not None else max(
            (c.score_db for c in [*among, candidate] if c.score_db is not None and c.folds is None), default=None)
        score = candidate.error or f"{candidate.score_db:.2f} dB"
        self.report(f"{title}: {score}{stopped} in {candidate.seconds:.0f} s; "
                    f"best so far {'-' if leader is None else f'{leader:.2f} dB'}; "
                    f"{time_left(ahead, [*among, candidate], self.ranking, maybe, self.ridden)}"
                    + (f"; {candidate.why}" if decide and candidate.why else ""))
        return candidate, samples

    def _judged(self, candidate: Candidate, kept: Sequence[Mapping[str, str]] | None = None,
                rival: tuple[Candidate, np.ndarray] | None = None
                ) -> tuple[Candidate, np.ndarray | None, dict[str, np.ndarray]]:
        """``candidate``'s settings calibrated on each fold and judged on its held-out part: the SNR of those samples
        pooled (its score), each sample's error energy, and the outputs pooled; its error where the technique does not
        apply to this graph. With ``rival`` (a candidate and its samples' error energies), it stops after a fold where
        it is :func:`out_of_reach` (``candidate.folds``), where that rival met the case's bounds or the candidate can
        no longer meet them."""
        samples, pooled, output, settings = None, {}, self.output, candidate.settings
        unchanged = changes_nothing(settings, self.folds[0].fp32_onnx(self.model))
        if unchanged:  # the graph its base makes: not judged again
            candidate.error = f"changes nothing in this graph: {unchanged}"
            return candidate, None, pooled
        try:
            recipe = self.base.with_settings(settings)
            if recipe.fallback_pending:
                per_fold = list(kept) if kept is not None else fallback_per_part(
                    self.whole, self.model, recipe, self.held_out)
                self.per_fold[settings] = per_fold
                recipes = [recipe.with_kept(layers) for layers in per_fold]
            else:
                recipes = [recipe] * len(self.folds)
            outputs = []
            for fold, fold_recipe in zip(self.folds, recipes):
                outputs.append(fold.recipe_semantics(self.model, fold_recipe, "evaluation"))
                pooled = {name: np.concatenate([out[name] for out in outputs]) for name in self.spec.outputs}
                samples = sample_noise(self.scored_reference[:len(pooled[output])], self.scored(pooled[output]))
                if rival is not None and len(outputs) < len(self.folds) and out_of_reach(samples, rival[1]) and (
                        rival[0].passed or self.cannot_meet_bounds(pooled)):
                    candidate.folds = len(outputs)
                    candidate.why = (f"not taken: stopped after {len(outputs)} of {len(self.folds)} folds, its mean "
                                     f"paired gain over the best before it plus {REACH_SE:g} standard errors short of "
                                     f"{MIN_GAIN_DB:g} dB")
                    break
            candidate.score_db = round(pooled_snr_db(self.scored_reference, samples), 4)
        except (ResourceError, UserCodeError):  # the machine's or the user's metric's, not the technique's: no runner
            raise  # chooses among fewer candidates
        except HarnessError as exc:  # a technique that does not apply to this graph
            candidate.error = str(exc).splitlines()[0]
        return candidate, samples, pooled


def search(whole: Workbench, folds: Sequence[Workbench], held_out: Sequence[np.ndarray], model: str, base: QDQ,
           judging: ByKind, auto: AutoSettings, incumbent: RecipeSettings | None = None,
           progress: Progress | None = None) -> SearchResult:
    """The best settings for ``base`` (a Q/DQ recipe) on ``model``, each candidate judged on every fold's held-out
    part (:class:`Trials`). ``incumbent`` (a lock's settings) is judged first on the same samples, and the choice
    against it by :func:`better`; ``progress`` hears of each candidate as it ends."""
    trials = Trials(whole, folds, held_out, model, base, judging, progress or (lambda line: LOG.info("%s", line)))
    result = SearchResult(chosen=RecipeSettings(), held_out_samples=trials.samples, folds=len(folds),
                          layers=trials.layers)
    best: tuple[Candidate, np.ndarray] | None = None
    planned = stages(auto, result.layers)
    trials.planned = sum(map(len, planned)) + (incumbent is not None)
    memory = available_memory()
    trials.report(f"recipe search {model} {base.name}: at most {trials.planned} candidates, each calibrated and "
                  f"judged on {len(folds)} folds of {result.held_out_samples} calibration samples"
                  + ("" if memory is None else f"; {memory / 2 ** 30:.1f} GiB of memory available")
                  + (f"; GPTQ's matrix work on {matrix_key()}" if any(each.gptq for stage in planned for each in stage)
                     else ""))
    kept = None
    if incumbent is not None:
        result.incumbent, kept = trials.judge(incumbent, [option for stage in planned for option in stage])
    seen: list[RecipeSettings] = []  # settings tried or left untried: a later stage may name them again
    ranked_for: dict[RecipeSettings, RecipeSettings] = {}  # a calibrator judged at another's layers: whose ranking
    for number, stage in enumerate(planned):
        stage_best = best
        for index, option in enumerate(stage):  # each alternative on top of the previous stages' best
            settings = option.over(best[0].settings) if best else option
            if settings in seen:
                continue
            seen.append(settings)
            if (stage_best or best) is not None and not trials.in_time(auto.budget_s):
                result.not_tried.append(settings)
                continue
            at_layers = best is not None and option in CALIBRATORS and best[0].settings in trials.per_fold
            if at_layers:  # the fallback stage's layers, not a ranking for each calibration
                ranked_for[settings] = ranked_for.get(best[0].settings, best[0].settings)
            leader = stage_best or best  # where it misses the case's bounds, so may the choice: count the tries past it
            beyond = beyond_plan(settings, result.layers, auto) if leader and leader[0].passed is False else []
            candidate, samples = trials.judge(settings, upcoming(settings, [*stage[index + 1:], *(
                each for after in planned[number + 1:] for each in after), *beyond], seen), result.candidates,
                kept=trials.per_fold[best[0].settings] if at_layers else None, rival=stage_best, decide=True,
                maybe=len(beyond[1:]))
            result.candidates.append(candidate)
            if samples is not None and candidate.taken:
                stage_best = candidate, samples
        best = stage_best
    if result.not_tried:
        result.note = (f"stopped at the wall-time limit of {auto.budget_s:g} s: {len(result.not_tried)} candidates "
                       f"not tried (each starts only where the slowest so far, {trials.slowest:.0f} s, still fits), "
                       "so another runner may choose otherwise and no lock takes this choice")
    if best is None:
        raise CalibrationError(f"recipe auto for {model!r}: every candidate failed; the first: "
                               f"{result.candidates[0].error}")
    result.chosen = best[0].settings
    if result.chosen in ranked_for:  # the final recipe keeps the layers it was judged with
        ranked = choose_fallback(whole, model, base.with_settings(ranked_for[result.chosen]))
        result.kept = tuple(sorted(ranked.items()))
    if best[0].passed is False:  # say what the case's bounds would take: never chosen past the user's share
        plan, start = beyond_plan(result.chosen, result.layers, auto), trials.done
        trials.planned += len(plan)
        ranker = ranked_for.get(result.chosen, result.chosen)  # more layers wider, ranked as the choice's were

        def wider(share: float, formats: Formats = auto.wider_formats) -> Candidate:
            more = RecipeSettings(fallback=share, fallback_format=formats)
            kept = None if ranker == result.chosen else fallback_per_part(whole, model, base.with_settings(
                more.over(ranker)), held_out)
            return trials.judge(more.over(result.chosen), plan[trials.done - start + 1:], result.candidates,
                                kept=kept, maybe=len(plan) - 1 if trials.done == start else 0)[0]

        result.beyond = fewest_in_float(wider, result.layers, auto.max_fallback, lambda: trials.in_time(auto.budget_s),
                                        (lambda share: wider(share, auto.wider_formats[-1:]))
                                        if len(auto.wider_formats) > 1 else None)
        result.note = " ".join(filter(None, [result.note, beyond_note(result.beyond, result.layers,
                                                                      auto.max_fallback)]))
        trials.report(f"recipe search {model} {base.name}: {result.note}")
    if result.incumbent is not None:
        result.beats_incumbent = result.chosen != result.incumbent.settings and (kept is None or better(
            best[1], kept, best[0].passed, result.incumbent.passed))
    result.passed_if = trials.passed_if
    return result
