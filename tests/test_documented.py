"""Every command and option README documents exists as documented: `--gate-policy` was documented and crashed on
every file, with no test that ran it. Each `quantverdict SUBCOMMAND --option` README writes (in its shell blocks and
inline code) must be an option of that subcommand's parser, each `--qv-…` pytest option one the plugin declares, and
each subcommand answers `--help`."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.run.commands import COMMANDS, build_parser
from quantverdict.run.settings import SETTINGS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _snippets() -> list[str]:
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", README, flags=re.S)
    lines = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    return lines + re.findall(r"`([^`\n]*quantverdict [a-z][^`\n]*)`", README)


def _documented() -> dict[str, set[str]]:
    """subcommand → the options README gives it."""
    found: dict[str, set[str]] = {}
    for snippet in _snippets():
        for match in re.finditer(r"quantverdict ([a-z][a-z-]*)((?:[^&|;]*))", snippet):
            command, rest = match.group(1), match.group(2)
            if command in COMMANDS:
                found.setdefault(command, set()).update(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest))
    return found


def _parsers() -> dict[str, set[str]]:
    parser = build_parser()
    [subparsers] = [action for action in parser._actions if action.choices and isinstance(action.choices, dict)]
    return {name: set(sub._option_string_actions) for name, sub in subparsers.choices.items()}


def test_readme_documents_only_options_its_commands_have():
    documented, parsers = _documented(), _parsers()
    assert len(documented) >= 10  # the walk finds README's commands
    wrong = {command: sorted(options - parsers[command]) for command, options in documented.items()
             if options - parsers[command]}
    assert not wrong, f"README documents options these commands do not have: {wrong}"


def test_readme_documents_only_pytest_options_the_plugin_declares():
    declared = {f"--qv-{name}" for name in SETTINGS}
    used = set(re.findall(r"(--qv-[a-z-]+)", README))
    assert used and used <= declared, sorted(used - declared)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_answers_help(command):
    proc = subprocess.run([sys.executable, "-m", "quantverdict", command, "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: quantverdict " + command), proc.stderr[-1000:]
