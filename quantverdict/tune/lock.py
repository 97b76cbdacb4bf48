"""The recipe lock file: each searched recipe (``recipe: auto``) resolved once, committed, read in a diff.

As ``uv.lock`` and ``poetry.lock`` do for dependencies: ``quantverdict lock`` searches and writes it, every later run
(``pytest -m int8``, ``quantverdict run``) builds the locked recipe with no search, and a search runs again only
on purpose (``quantverdict lock --update MODEL``) or in a nightly check (``quantverdict lock --check``) that proposes
a better recipe beside the lock. For each model and precision it holds the chosen settings, the layers kept in
float by name, the hashes of the FP32 graph and the calibration data they were chosen for, the versions and runner
class that chose them, and each candidate's score: what a reviewer needs to read a recipe change.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from quantverdict.cache import atomic_write_bytes, file_lock
from quantverdict.documents import DocumentError, read_yaml, validate
from quantverdict.errors import HarnessError
from quantverdict.tune.result import LOCKED_OUT, Candidate, SearchResult, Settings

VERSION = 1
HEADER = """\
# quantverdict recipe lock: the INT8/FP8 recipes chosen by `quantverdict lock`, applied by every run with no search.
# Commit it; review its diff as the recipe change. Re-search on purpose: quantverdict lock --update MODEL.
"""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SearchEvidence(_Closed):
    """A search (:class:`quantverdict.tune.result.SearchResult`) as the lock file writes it."""

    folds: int
    held_out_samples: int
    # what a candidate's ``passed`` means: the case's bounds, met on its held-out samples (a lower bound by one standard
    # error of the evaluation's estimate: :mod:`quantverdict.tune.margin`)
    passed_if: list[str] = []
    candidates: list[Candidate]  # each as the search judged it, less what the lock leaves out (result.LOCKED_OUT)
    note: str | None = None  # what the case's bounds need where the choice misses them (or the wall-time stop)
    beyond: list[Candidate] = []  # the choice with more layers in FP32 than the user allows, tried for that note

    @classmethod
    def of(cls, searched: SearchResult) -> "SearchEvidence":
        return cls(folds=searched.folds, held_out_samples=searched.held_out_samples, passed_if=searched.passed_if,
                   candidates=searched.candidates, note=searched.note or None, beyond=searched.beyond)


class LockedRecipe(_Closed):
    settings: Settings  # the recipe settings the search chose
    float_layers: list[str] | dict[str, str]  # layers its fallback keeps wider, by node name (→ format, where it chose)
    graph_sha256: str  # the FP32 graph they were chosen for
    calibration_data: str  # content key of the calibration batches
    qdq_sha256: str | None = None  # the Q/DQ graph the locking runner built (another CPU's differs where rounding flipped)
    chosen_by: dict[str, str]  # package versions and the runner class
    search: SearchEvidence

    def kept(self, offered: tuple[str, ...]) -> dict[str, str]:
        """Each float layer with its format: its own where the lock names one, else the one ``offered``."""
        if isinstance(self.float_layers, dict):
            return dict(self.float_layers)
        return {layer: offered[-1] for layer in self.float_layers}


@dataclass(frozen=True)
class LockState:
    """For the record: the lock a recipe came from, whether its entry was chosen for this very FP32 graph and
    calibration data, whether this runner built the Q/DQ graph the locking runner built (None: not compared), and
    what to do where the inputs moved."""

    path: str
    graph_sha256: str
    current_graph: bool
    current_calibration: bool
    same_qdq_graph: bool | None
    note: str | None = None
    search_note: str | None = None  # the locking search's word where its choice missed the case's bounds

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items()
                if key not in ("note", "search_note") or value is not None}


class LockFile(_Closed):
    version: Literal[1]
    recipes: dict[str, dict[str, LockedRecipe]] = {}  # model → precision → recipe


class RecipeLock:
    """A lock file's recipes by (model, precision); ``path`` where it is read from and written to."""

    def __init__(self, path: Path, recipes: dict[str, dict[str, LockedRecipe]] | None = None):
        self.path, self.recipes = path, recipes or {}
        self.changed: list[tuple[str, str]] = []  # entries put since it was read: what writing it merges in

    @classmethod
    def read(cls, path: Path) -> "RecipeLock":
        """The lock at ``path``, validated (each recipe's settings too: a lock edited by hand is read like a
        manifest), or an empty lock where there is no file."""
        if not path.exists():
            return cls(path)
        document = validate(read_yaml(path, "recipe lock"), LockFile, str(path))
        problems = [line for model, entries in document.recipes.items() for precision, entry in entries.items()
                    for line in _check(path, model, precision, entry)]
        if problems:
            raise DocumentError("\n".join(problems))
        return cls(path, {model: dict(entries) for model, entries in document.recipes.items()})

    def get(self, model: str, precision: str) -> LockedRecipe | None:
        return self.recipes.get(model, {}).get(precision)

    def put(self, model: str, precision: str, entry: LockedRecipe) -> None:
        self.recipes.setdefault(model, {})[precision] = entry
        self.changed.append((model, precision))

    def text(self) -> str:
        """The lock as YAML: models, precisions and every mapping's keys sorted, an entry's fields in their reading
        order (settings first), settings on one line each, so that a diff shows what changed and nothing else."""
        document = {"version": VERSION, "recipes": {
            model: {precision: _readable(entry) for precision, entry in sorted(entries.items())}
            for model, entries in sorted(self.recipes.items())}}
        return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)

    def write(self, path: Path | None = None) -> Path:
        """The lock written to ``path`` (its own by default), whole. Its own file is re-read under an exclusive lock
        and this lock's changed entries merged into it: two ``lock`` processes (one per model) each kept the file's
        entries as they read them, and the last writer dropped the other's."""
        target = path or self.path
        if target.is_symlink() and not target.exists():
            raise HarnessError(f"cannot write the recipe lock {target}: it is a link to {os.readlink(target)}, which "
                               "does not exist (writing through it would write elsewhere)")
        try:
            if target != self.path:
                atomic_write_bytes(target, self.text().encode())
                return target
            folder = target.resolve().parent  # the real file's: locked as itself, no guard file left in /tmp
            folder.mkdir(parents=True, exist_ok=True)
            with file_lock(folder):
                on_disk = RecipeLock.read(target)
                for model, precision in self.changed:
                    on_disk.recipes.setdefault(model, {})[precision] = self.recipes[model][precision]
                self.recipes = on_disk.recipes
                atomic_write_bytes(target, self.text().encode())
        except OSError as exc:
            raise HarnessError(f"cannot write the recipe lock {target}: {exc.strerror or exc}") from exc
        return target


class _Dumper(yaml.SafeDumper):
    """Mappings of scalars (settings, versions) and of those (a candidate) in flow style: one line per candidate; a
    list of scalars (a setting's formats) counts as a scalar there."""


class _Lines(dict):  # type: ignore[type-arg]
    """A mapping written one key per line whatever it holds (the float layers' formats: a reviewer reads each)."""


def _flat(value: object) -> bool:
    return not isinstance(value, dict) and (not isinstance(value, list) or all(
        not isinstance(item, (dict, list)) for item in value))


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flow = all(_flat(value) or (isinstance(value, dict) and all(_flat(inner) for inner in value.values()))
               for value in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(_Lines, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data,
                                                                              flow_style=False))


def _readable(entry: LockedRecipe) -> dict[str, Any]:
    """An entry as it is written: its fields and each candidate's in their reading order, settings and versions
    sorted by name."""
    each = {"__all__": LOCKED_OUT}
    document = entry.model_dump(exclude_none=True, exclude={"search": {"candidates": each, "beyond": each}})
    for empty in ("beyond", "passed_if"):
        if not document["search"][empty]:
            del document["search"][empty]
    for part in (document, *document["search"]["candidates"], *document["search"].get("beyond", [])):
        part["settings"] = dict(sorted(part["settings"].items()))
    document["chosen_by"] = dict(sorted(document["chosen_by"].items()))
    if isinstance(document["float_layers"], dict):
        document["float_layers"] = _Lines(sorted(document["float_layers"].items()))
    return document


def _check(path: Path, model: str, precision: str, entry: LockedRecipe) -> list[str]:
    from quantverdict.precision import get_recipe, known_precisions
    from quantverdict.precision.qdq import QDQ
    from quantverdict.precision.settings import formats_words

    where = f"{path}: recipes.{model}.{precision}"
    if precision not in known_precisions():
        return [f"{where}: unknown precision (known: {', '.join(known_precisions())})"]
    try:
        settings = entry.settings
        recipe = get_recipe(precision).configured(settings)
    except HarnessError as exc:
        return [f"{where}.settings: {str(exc).splitlines()[0]}"]
    if entry.float_layers and not settings.fallback:
        return [f"{where}.float_layers: layers kept in float by a recipe whose settings name no fallback share"]
    offered = recipe.options.fallback_format if isinstance(recipe, QDQ) else ("fp32",)
    if len(offered) > 1 and entry.float_layers and not isinstance(entry.float_layers, dict):
        return [f"{where}.float_layers: fallback_format offers {formats_words(offered)}, so each layer names its format "
                "(layer: format)"]
    wrong = {layer: kept_in for layer, kept_in in entry.kept(offered).items() if kept_in not in offered}
    if wrong:
        return [f"{where}.float_layers: {wrong} not among the formats fallback_format offers ({formats_words(offered)})"]
    return []


def run_notes(cases: list[dict[str, Any]], lock: Path) -> list[str]:
    """What a run's recipes call for, from its cases (records' dicts): a recipe locked for an earlier graph (once per
    model and precision), and recipes a search chose at run time, which a lock would make reviewed and skip."""
    notes, searched = {}, set()
    for case in cases:
        recipe = (case.get("metrics") or {}).get("recipe") or {}
        note = (recipe.get("lock") or {}).get("note")
        if note:
            notes[(case.get("model"), case.get("precision"))] = f"{case.get('model')} {case.get('precision')}: {note}"
        if recipe.get("search"):
            searched.add(str(case.get("model")))
    lines = list(notes.values())
    if searched:
        lines.append(f"recipes chosen by a search, not a lock ({', '.join(sorted(searched))}): lock them to review "
                     f"them and skip the search: quantverdict lock (writes {lock})")
    return lines
