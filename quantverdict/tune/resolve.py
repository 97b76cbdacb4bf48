"""One finished recipe per (model, precision, graph target), resolved here and nowhere else.

Precedence, most binding first: a graph the user supplied for the precision (nothing to resolve); this run's own
settings (``--recipe-option``, ``--calibration``, which is one more recipe option) over the model's; for a model
that asks for a search (``recipe: auto``), the lock's entry (:mod:`quantverdict.tune.lock`), else the search
(:func:`quantverdict.tune.folds.search_recipe`); then the layers accuracy-aware fallback keeps in float, which a lock
names and a run otherwise chooses on the calibration set (:mod:`quantverdict.tune.fallback`). The artifact store
builds what it is given and knows nothing of this: the run hands it the finished recipes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol

from quantverdict.backends.samples import CODE as JOINING
from quantverdict.capabilities import Capabilities, package_version
from quantverdict.errors import HarnessError
from quantverdict.hashing import file_sha256, source_fingerprint
from quantverdict.judge.tolerances import ToleranceTable
from quantverdict.judge.workbench import Workbench
from quantverdict.memo import Memo
from quantverdict.models.data import BatchSource
from quantverdict.models.spec import Batch, ModelSpec
from quantverdict.precision import Recipe, get_recipe
from quantverdict.precision.matrix_device import VARIABLE, matrix_key
from quantverdict.precision.qdq import QDQ
from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.auto import AUTO_KEYS, BESIDE_AUTO, AutoSettings, auto_settings
from quantverdict.tune.check import NEAREST
from quantverdict.tune.lock import LockedRecipe, LockState, RecipeLock, SearchEvidence
from quantverdict.tune.result import Incumbent, SearchResult
from quantverdict.tune.search import Progress


class TuningBench(Workbench, Protocol):
    """What choosing a recipe needs of the run's artifacts beyond judging one: where a recipe's graph starts, the
    calibration batches and tolerances a search judges on, and views of the artifacts on other data (a search's
    held-out folds). :class:`quantverdict.run.artifacts.ArtifactStore` provides it."""

    caps: Capabilities
    tolerances: ToleranceTable

    def recipe_source(self, model: str, recipe: Recipe) -> Path: ...

    def variant(self) -> Any: ...

    def calibration_batches(self, model: str) -> list[Batch]: ...

    def planned_coverage(self, model: str, recipe: Recipe) -> dict[str, Any] | None:
        """What ``recipe``'s graph would quantize of the model's, from its placement alone (no calibration)."""
        ...

    def output_kinds(self, model: str) -> dict[str, str]:
        """What each output is (:mod:`quantverdict.judge.output_kinds`): a search judges it as the verdict will."""
        ...

    def on_batches(self, source: BatchSource) -> "TuningBench":
        """The same artifacts judged on ``source``'s batches (the torch modules and FP32 graphs shared)."""
        ...


# (bench, model, precision, the search's settings, settings judged beside the candidates, progress) → the search
Searcher = Callable[[TuningBench, str, str, AutoSettings, "Incumbent | None", "Progress | None"], SearchResult]
LOCKED_PACKAGES = ("quantverdict", "onnx", "onnxruntime", "numpy", "torch")


@dataclass(frozen=True)
class RecipeOptions:
    """What a run says about recipes: ``settings`` per precision over the models' own (a search then does not
    run), the ``lock`` applied, the ``search`` (None: never search), the models whose lock entries are set aside
    and searched again (``relock``; None: every model), whether each search also judges the lock's settings of the
    models set aside (``check``: a nightly run's paired test against the lock), and where progress lines go."""

    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    lock: RecipeLock | None = None
    search: Searcher | None = None
    relock: frozenset[str] | None = frozenset()
    check: bool = False
    progress: Progress | None = None


@dataclass(frozen=True)
class ResolvedRecipe:
    """A precision's finished recipe as a case judges it (its settings, and its fallback layers with their formats),
    where it came from, the lock's state where a lock gave it, and the search's evidence where a search chose it."""

    recipe: Recipe
    lock: LockState | None = None
    search: SearchResult | None = None

    @property
    def origin(self) -> Literal["settings", "lock", "search"]:
        return "lock" if self.lock is not None else "search" if self.search is not None else "settings"


class Resolver:
    """The recipes of one run's artifacts (``bench``), each resolved once per process."""

    def __init__(self, bench: TuningBench, options: RecipeOptions | None = None):
        self.bench, self.options = bench, options or RecipeOptions()
        self._searches, self._fallbacks = Memo(), Memo()

    def recipe(self, model: str, precision: str, target: str) -> Recipe:
        """The recipe of ``precision`` for a graph target, finished: settings resolved, fallback layers chosen."""
        recipe = get_recipe(precision).for_target(target)
        if not recipe.configurable:  # FP16, or a runtime's own layout (ONNX Runtime's CPU INT8)
            return recipe
        settings = self.settings(model, precision)
        return self.with_fallback(model, recipe.configured(settings))

    def settings(self, model: str, precision: str) -> RecipeSettings:
        """The settings the lock holds, else those the search chose, else the model's own with this run's over
        them."""
        locked = self.locked(model, precision)
        if locked is not None:  # what the manifest fixes beside the search as it says now, the rest as locked
            auto = self.auto(model, precision)
            assert auto is not None  # a lock applies to searched recipes only
            return auto.fixed().over(locked.settings.unset(*BESIDE_AUTO))
        searched = self.search(model, precision)
        if searched is not None:
            return searched.chosen
        own = {k: v for k, v in self.bench.spec(model).recipe.get(precision, {}).items() if k not in AUTO_KEYS}
        return RecipeSettings.parse({**own, **self.options.settings.get(precision, {})}, precision)

    def auto(self, model: str, precision: str) -> AutoSettings | None:
        """The search's settings where ``precision``'s recipe is the search's to choose: the model asks for one
        (``recipe: auto``, a manifest model's default for INT8 and FP8), supplies no graph of its own for the
        precision, and this run sets none of the settings."""
        spec = self.bench.spec(model)
        auto = auto_settings(spec.recipe.get(precision, {}))
        if auto is None or precision in spec.quantized or self.options.settings.get(precision):
            return None
        return auto

    def locked(self, model: str, precision: str) -> LockedRecipe | None:
        """The lock's recipe where it applies: a search would choose it otherwise, and the run does not set the
        model's entry aside."""
        lock, relock = self.options.lock, self.options.relock
        if lock is None or relock is None or model in relock:
            return None
        return lock.get(model, precision) if self.auto(model, precision) is not None else None

    def search(self, model: str, precision: str) -> SearchResult | None:
        """The search that chose ``precision``'s settings, where it is the search's to choose and no lock entry
        applies; None otherwise. With ``check``, the locked settings are judged beside the candidates."""
        auto, searcher = self.auto(model, precision), self.options.search
        if auto is None or searcher is None or self.locked(model, precision) is not None:
            return None
        entry = self.options.lock.get(model, precision) if self.options.lock and self.options.check else None
        incumbent = self._incumbent(model, entry, precision) if entry else None
        return self._searches.get((model, precision), lambda: searcher(self.bench, model, precision, auto, incumbent,
                                                                        self.options.progress))

    def _incumbent(self, model: str, entry: LockedRecipe, precision: str) -> Incumbent:
        """A lock entry as a check judges it: its settings and its layers kept wider (where the graph still has them),
        the best of the others its search judged to the end, and whether it met the case's bounds when locked."""
        settings = entry.settings
        judged = [evidence for evidence in entry.search.candidates if evidence.folds is None]  # not stopped early
        others = [(evidence.score_db, evidence.settings) for evidence in judged
                  if evidence.score_db is not None and not evidence.error]
        nearest = [option for _, option in sorted(others, key=lambda pair: -pair[0]) if option != settings]
        recipe = get_recipe(precision).for_target("emulated").configured(settings)
        kept = None
        if isinstance(recipe, QDQ) and recipe.fallback_pending:
            try:
                kept = tuple(sorted(self._present(model, recipe, entry).items()))
            except HarnessError:  # the graph lost a locked layer: the check ranks them again (kept stays None)
                pass
        met = [evidence.passed for evidence in judged if evidence.settings == settings]
        return Incumbent(settings, tuple(dict.fromkeys(nearest))[:NEAREST], kept, met[-1] if met else None)

    def declared(self, spec: ModelSpec, precision: str) -> ModelSpec:
        """``spec`` with ``precision``'s recipe settings as the lock holds them, where its entry applies, each float
        layer's format among them: what decides the GPU the case needs (an INT8 recipe that offered FP8 and kept no
        layer in it runs wherever INT8 does)."""
        if self.options.lock is None:
            return spec
        try:
            locked = self.locked(spec.name, precision)
        except HarnessError:  # a recipe setting no recipe takes: the case itself says so, naming it
            return spec
        if locked is None:
            return spec
        chosen = {"layer_formats": dict(locked.float_layers)} if isinstance(locked.float_layers, dict) else {}
        return replace(spec, recipe={**spec.recipe, precision: {**locked.settings.to_dict(), **chosen}})

    def resolved(self, model: str, precision: str) -> ResolvedRecipe:
        """``precision``'s recipe as the case's graph is judged (its emulated target), with where it came from."""
        return ResolvedRecipe(self.recipe(model, precision, "emulated"), self.lock_state(model, precision),
                              self.search(model, precision))  # a lock's recipe is never searched: one of the two

    def lock_state(self, model: str, precision: str) -> LockState | None:
        """The lock the recipe came from, whether it was chosen for this very FP32 graph and calibration data, and
        whether this runner built the Q/DQ graph the locking runner built from them."""
        locked = self.locked(model, precision)
        if locked is None:
            return None
        assert self.options.lock is not None
        graph, data = self.bench.fp32_sha256(model), self.bench.data_key(model, "calibration")
        changed = [f"{what} ({name} {then[:12]}, now {now[:12]})" for what, name, now, then in (
            ("graph", "sha256", graph, locked.graph_sha256),
            ("calibration data", "key", data, locked.calibration_data)) if now != then]
        note, same = None, None
        if changed:  # each hash that moved, not the graph's twice where only the data moved
            note = (f"recipe locked for an earlier {' and '.join(changed)}; re-search on purpose: quantverdict lock "
                    f"--update {model}, or take the proposed lock of quantverdict lock --check")
        elif locked.qdq_sha256 is not None:  # the same inputs: another CPU's kernels must not change the bytes
            built = file_sha256(self.bench.precision_onnx(model, self.recipe(model, precision, "emulated")))
            same = built == locked.qdq_sha256
            if not same:  # it was recorded and said nowhere: an edited hash passed silently
                then, here = locked.chosen_by.get("matrix_device", "cpu"), matrix_key()  # locks before it: the CPU's
                device = f", GPTQ's matrix work on {then} then and on {here} here ({VARIABLE})" \
                    if locked.settings.gptq and then != here else ""
                note = (f"this runner built a precision graph other than the lock's from the same graph and "
                        f"calibration data (sha256 {built[:12]}, locked {locked.qdq_sha256[:12]}): the recipe rounds "
                        f"differently here (another package version{device}, or an edited lock); re-lock on purpose: "
                        f"quantverdict lock --update {model}")
        return LockState(str(self.options.lock.path), locked.graph_sha256, graph == locked.graph_sha256,
                         data == locked.calibration_data, same, note, locked.search.note)

    def entry(self, model: str, precision: str) -> LockedRecipe:
        """The lock entry of the recipe this run resolves by search: settings, float layers, what they were chosen
        for and by, and each candidate's evidence; a search stopped by the wall-time limit is never locked."""
        searched = self.search(model, precision)
        if searched is None:
            raise HarnessError(f"model {model!r} {precision}: its recipe is not searched (recipe: auto), so there "
                               "is nothing to lock")
        if not searched.complete:
            raise HarnessError(f"model {model!r} {precision}: not locked: {searched.note}")
        recipe = self.recipe(model, precision, "emulated")
        bench = self.bench
        return LockedRecipe(
            settings=searched.chosen, float_layers=float_layers(recipe),
            graph_sha256=bench.fp32_sha256(model), calibration_data=bench.data_key(model, "calibration"),
            qdq_sha256=file_sha256(bench.precision_onnx(model, recipe)),
            chosen_by={**{name: package_version(name) or "absent" for name in LOCKED_PACKAGES},
                       "runner_class": bench.caps.runner_class,
                       **({"matrix_device": matrix_key()} if searched.chosen.gptq else {})},  # where GPTQ rounded
            search=SearchEvidence.of(searched))

    def with_fallback(self, model: str, recipe: Recipe) -> Recipe:
        """``recipe`` with the layers its accuracy-aware fallback keeps wider, each in its format (:meth:`kept`)."""
        if not recipe.fallback_pending:
            return recipe
        assert isinstance(recipe, QDQ)  # the recipes that choose a fallback
        kept = self.kept(model, recipe)
        return recipe.with_kept(kept)

    def kept(self, model: str, recipe: QDQ) -> dict[str, str]:
        """The layers ``recipe``'s fallback keeps wider, each with its format: the lock's, or those a check judged the
        chosen settings with (the lock's too), else the most sensitive on the calibration set (:func:`choose_fallback`),
        once per content key of what decides them."""
        locked = self.locked(model, recipe.name)
        if locked is not None:
            return self._present(model, recipe, locked)
        searched = self.search(model, recipe.name)
        if searched is not None and searched.kept is not None:  # a check judged its choice at the lock's layers
            return dict(searched.kept)
        from quantverdict.tune.fallback import choose_fallback

        bench = self.bench

        def choose() -> dict[str, str]:
            parts = [bench.fp32_sha256(model), recipe.params(), bench.data_key(model, "calibration"),
                     *bench.onnxruntime_cpu_parts("quantverdict.judge", "quantverdict.tune.fallback", JOINING),
                     source_fingerprint("quantverdict.precision"), bench.variant()]
            return bench.cache.json("fallback", parts, lambda: choose_fallback(bench, model, recipe),
                                    {"model": model, "precision": recipe.name})

        return self._fallbacks.get((model, json.dumps(recipe.params(), sort_keys=True, default=str)), choose)

    def _present(self, model: str, recipe: QDQ, locked: LockedRecipe) -> dict[str, str]:
        """The lock's float layers with their formats, each a node of the graph the recipe starts from, or one line
        naming those that are not."""
        import onnx

        graph = onnx.load(str(self.bench.recipe_source(model, recipe)), load_external_data=False).graph
        names = {node.name for node in graph.node}
        missing = [name for name in locked.float_layers if name not in names]
        if missing:
            lock = self.options.lock
            raise HarnessError(f"{lock.path if lock else 'the recipe lock'}: recipes.{model}.{recipe.name}.float_layers: "
                               f"{missing} are not layers of {model!r}'s graph; re-search on purpose: "
                               f"quantverdict lock --update {model}")
        return locked.kept(recipe.options.fallback_format)


def float_layers(recipe: Recipe) -> list[str] | dict[str, str]:
    """A finished recipe's fallback layers as a lock holds them: by name, or, where it chose each one's format among
    several, name → format."""
    if not isinstance(recipe, QDQ):
        return []
    kept = recipe.options.kept()
    return dict(sorted(kept.items())) if len(recipe.options.fallback_format) > 1 else sorted(kept)
