"""A run's settings, each declared once: the CLI's options, the pytest plugin's options and ini keys,
and the project's ``[tool.quantverdict]`` table in pyproject.toml all come from :data:`SETTINGS`.

Precedence: the command line, then (under pytest) the ``qv_*`` ini keys of pytest.ini or
``[tool.pytest.ini_options]``, then ``[tool.quantverdict]`` of the nearest pyproject.toml that has
one (searched upwards from the working or root directory), then the defaults below. Paths are
resolved against the folder of the file that named them (the working directory for the command line).
The pytest plugin prefixes its options (``--qv-models``): it is loaded by every pytest run in an
environment where the package is installed, so its names must not collide with other plugins'.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from quantverdict.documents import DocumentError, suggest

Kind = Literal["path", "csv", "text", "flag", "list"]
PYTEST_PREFIX = "qv-"
INI_PREFIX = "qv_"
TABLE = "quantverdict"


@dataclass(frozen=True)
class Setting:
    name: str  # the option without dashes, and the key of [tool.quantverdict]
    help: str
    kind: Kind = "text"
    default: str | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def add_to(self, add: Callable[..., Any], prefix: str = "") -> None:
        """Declare this setting through ``argparse``'s ``add_argument`` or pytest's ``addoption``; its
        value is None where not given, so project settings and defaults can fill it in."""
        default = f" (default: {self.default})" if self.default else ""
        options: dict[str, Any] = {"dest": self.dest, "default": None, "help": self.help + default}
        if self.kind == "flag":
            options.update(action="store_const", const=True)
        elif self.kind == "list":
            options.update(action="append", metavar=self.metavar or "VALUE")
        else:
            options["metavar"] = self.metavar or ("PATH" if self.kind == "path" else self.name.upper().replace("-", "_"))
        add(f"--{prefix}{self.name}", **options)


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("manifest", "model manifest (YAML): your models, and the registered ones it includes", "path"),
    Setting("models", "comma-separated model names (default: the manifest's, else every registered model; the main "
            "job leaves out the slow built-ins unless named)", "csv"),
    Setting("precisions", "comma-separated precisions (default: all each backend offers)", "csv"),
    Setting("backends", "comma-separated backends (default: all)", "csv"),
    Setting("tolerances", "tolerance file merged over the packaged table", "path"),
    Setting("calibration", "INT8/FP8 calibration method: max (default), entropy, percentile, mse"),
    Setting("recipe-option", "INT8/FP8 recipe setting over the models' own, e.g. smoothquant=0.5, "
                             "int8:calibration=mse (repeatable; recorded in the run record)", "list",
            metavar="[PRECISION:]KEY=VALUE"),
    Setting("lock", "recipe lock file: the searched recipes (recipe: auto) that `quantverdict lock` chose, applied "
                    "with no search", "path", "quantverdict.lock"),
    Setting("relock", "comma-separated models whose locked recipes are set aside and searched again ('all': every "
                      "model); `quantverdict lock --update` writes what the search chose", "csv", metavar="MODELS"),
    Setting("baseline", "run record to judge every case against under the release gate's rules", "path"),
    Setting("gate-policy", "gate policy file merged over the packaged one", "path"),
    Setting("report-dir", "where run records (and history.sqlite) are written", "path", "reports"),
    Setting("history-db", "run history the record is appended to (default: history.sqlite in the report dir)",
            "path"),
    Setting("cache-dir", "artifact cache shared by runs and workers", "path", ".quantverdict-cache"),
    Setting("shard", "run part i of n of the matrix (i/n); 'merge' combines the records", metavar="I/N"),
    Setting("balance-by", "an earlier run record whose cases' times balance --shard's parts and give "
                          "pytest-xdist's workers the longest cases first", "path"),
    Setting("time", "also time each case (median latency, for speedups)", "flag"),
]}
RUN = tuple(SETTINGS)
COMMON = ("manifest", "cache-dir")  # what every command that reads models needs


def add_options(add: Callable[..., Any], names: tuple[str, ...] = RUN, prefix: str = "") -> None:
    for name in names:
        SETTINGS[name].add_to(add, prefix)


@dataclass(frozen=True)
class ProjectConfig:
    """``[tool.quantverdict]`` of a pyproject.toml (empty where there is none)."""

    path: Path | None
    values: Mapping[str, Any]

    @classmethod
    def find(cls, *starts: Path) -> "ProjectConfig":
        """The nearest pyproject.toml at or above the first of ``starts`` that has one with a
        ``[tool.quantverdict]`` table."""
        for start in starts:
            for folder in [start.resolve(), *start.resolve().parents]:
                candidate = folder / "pyproject.toml"
                if candidate.is_file():
                    table = _read_table(candidate)
                    if table is not None:
                        return cls(candidate, _checked(table, candidate))
        return cls(None, {})


def _read_table(path: Path) -> dict[str, Any] | None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DocumentError(f"cannot read {path}: {exc}") from exc
    table = document.get("tool", {}).get(TABLE)
    return table if isinstance(table, dict) else None


def _checked(table: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The table's values, each name checked (with the closest allowed one) and typed."""
    problems, values = [], {}
    for key, value in table.items():
        setting = SETTINGS.get(key)
        if setting is None:
            problems.append(f"{path}: [tool.{TABLE}].{key}: unknown setting{suggest(key, list(SETTINGS))}")
            continue
        expected = {"flag": bool, "list": list, "csv": (list, str)}.get(setting.kind, str)
        if not isinstance(value, expected) or (  # type: ignore[arg-type]
                isinstance(value, list) and not all(isinstance(item, str) for item in value)):
            problems.append(f"{path}: [tool.{TABLE}].{key}: expected {_kind_words(setting.kind)}, got {value!r}")
            continue
        unknown = _unknown_precisions(value) if key == "precisions" else None
        if unknown:
            problems.append(f"{path}: [tool.{TABLE}].{key}: {unknown}")
            continue
        values[key] = value
    if problems:
        raise DocumentError("\n".join(problems))
    return values


def _unknown_precisions(value: list[str] | str) -> str | None:
    """What is wrong with a project's precisions (an unknown name, with the known ones), or None."""
    from quantverdict.precision import known_precisions

    names = [name.strip() for name in (value if isinstance(value, list) else value.split(",")) if name.strip()]
    unknown = [name for name in names if name not in known_precisions()]
    return f"unknown precision {unknown[0]!r} (known: {', '.join(sorted(known_precisions()))})" if unknown else None


def _kind_words(kind: Kind) -> str:
    return {"flag": "true or false", "list": "a list of strings", "csv": "a list or comma-separated string",
            "path": "a path (string)", "text": "a string"}[kind]


@dataclass(frozen=True)
class Settings:
    """Resolved values by name: paths absolute, lists as lists, a missing value None."""

    values: Mapping[str, Any]
    config: ProjectConfig

    @classmethod
    def resolve(cls, given: Mapping[str, Any], where: Path, ini: Mapping[str, tuple[Any, Path]] | None = None,
                root: Path | None = None) -> "Settings":
        """``given`` (option dests → values, None where not given; paths relative to ``where``), over
        ``ini`` (name → (value, the ini file's folder)), over the project config found from ``where``, else
        from ``root`` (pytest's rootdir), over the defaults (relative to the project config's folder, else
        ``root``). pytest decides its rootdir before plugins' options are known, so it can be led astray by
        an option's value given after a space: the working directory is looked at first."""
        root = root or where
        config = ProjectConfig.find(where, root)
        home = config.path.parent if config.path else root
        values: dict[str, Any] = {}
        for name, setting in SETTINGS.items():
            value, base = given.get(setting.dest), where
            if value is None and ini and name in ini:
                value, base = ini[name]
            if value is None and name in config.values:
                value, base = config.values[name], home
            if value is None and setting.default is not None:
                value, base = setting.default, home
            values[name] = _typed(setting, value, base)
        return cls(values, config)

    def recipe_settings(self) -> dict[str, dict[str, Any]]:
        return recipe_settings(self["recipe-option"] or [])

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def _typed(setting: Setting, value: Any, base: Path) -> Any:
    if value is None:
        return None
    if setting.kind == "path":
        return (base / Path(value).expanduser()).resolve()
    if setting.kind == "csv":
        items = value if isinstance(value, list) else str(value).split(",")
        return [str(item).strip() for item in items if str(item).strip()] or None
    if setting.kind == "list":
        return [str(item) for item in value]
    return value


def recipe_settings(options: list[str]) -> dict[str, dict[str, Any]]:
    """``[PRECISION:]KEY=VALUE`` options as settings per quantized precision (values parsed as YAML:
    numbers, true/false, null)."""
    import yaml

    from quantverdict.errors import HarnessError
    from quantverdict.precision import get_recipe, known_precisions

    settings: dict[str, dict[str, Any]] = {}
    for option in options:
        target, _, assignment = option.rpartition(":") if ":" in option.partition("=")[0] else ("", "", option)
        key, equals, value = assignment.partition("=")
        if not equals or not key:
            raise HarnessError(f"--recipe-option {option!r}: expected [PRECISION:]KEY=VALUE")
        for precision in [target] if target else ["int8", "fp8"]:
            if precision not in known_precisions():
                raise HarnessError(f"--recipe-option {option!r}: unknown precision {precision!r}")
            settings.setdefault(precision, {})[key] = yaml.safe_load(value)
    for precision, given in settings.items():  # refused up front, not by every case
        try:
            get_recipe(precision).configured(given)
        except HarnessError as exc:
            raise HarnessError(f"--recipe-option: {exc}") from None
    return settings


MANIFEST_NAMES = ("models.yaml", "models.yml")  # what `quantverdict init` writes, and its common spelling


def unnamed_manifest(root: Path, collected_none: bool) -> list[str]:
    """What a run that no setting named a manifest for says: how to name the one lying in ``root``, or, where there
    is none and nothing was collected, how to write one."""
    found = next((name for name in MANIFEST_NAMES if (root / name).is_file()), None)
    if found:
        return [f"{found} is not named as the manifest, so none of its cases ran: run `quantverdict init` (it adds "
                f"manifest = \"{found}\" under [tool.quantverdict] in pyproject.toml) or pass --qv-manifest={found}"]
    return ["no manifest is configured here, so no model of yours was collected: run `quantverdict init` to write "
            "models.yaml (every field documented) and name it under [tool.quantverdict] in pyproject.toml"] \
        if collected_none else []
