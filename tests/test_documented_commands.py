"""Every ``envace-lite`` command written in README.md and docs/*.md is one the CLI accepts.

Each command (in a fenced block, continuation lines joined, or in an inline code span) is parsed
by the CLI's own click parser: the subcommand and every option must exist. Its ``--profile`` must
name a profile, each ``--set`` a config field by its current key (never a ``config.MOVED_KEYS``
name), and a ``notebooks`` command's ``--only`` and ``-p`` must pass the series' own
pre-start check (``check_series_params``: every ``-p`` name against every selected notebook's
parameters cell). Placeholders such as ``<folder>`` and ``DIR`` stand for paths the reader
supplies, so path-valued parameters are checked for existence only when written literally.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from typer.main import get_command

from envace_lite.cli.main import app, parse_notebook_params
from envace_lite.config import MOVED_KEYS, ConfigError, field_type
from envace_lite.course.series import check_series_params, discover, select
from envace_lite.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    """``(file, arguments after "envace-lite")`` of every documented command."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                m = re.match(r"\s*!?(?:PROFILE=\S+ )?envace-lite\s+(.*?)\s*(?:#.*)?$", line)
                if m:
                    found.append((path.name, m.group(1)))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`!?(envace-lite [^`]+)`", prose):
            found.append((path.name, span.removeprefix("envace-lite ").strip()))
    return found


COMMANDS = documented_commands()


def test_the_docs_hold_commands():
    """The walk finds the documented commands (a broken regex would pass every case below)."""
    assert len(COMMANDS) >= 10
    assert any(args.startswith("notebooks --profile laptop --only 04,05 -p 04:steps=1")
               for _, args in COMMANDS)


def _parse(args: list[str]) -> tuple[str, dict]:
    """``(subcommand, its parsed parameters)`` by click's own parser (nested groups followed)."""
    cmd, ctx, name = get_command(app), None, "envace-lite"
    args = list(args)
    while isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=name, parent=ctx)
        while args and args[0].startswith("-"):  # the root's own flags (--debug)
            args.pop(0)
        if not args:
            raise click.UsageError("no subcommand")
        name = args.pop(0)
        sub = cmd.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no such command {name!r}")
        cmd = sub
    return name, cmd.make_context(name, args, parent=ctx).params


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_documented_command_parses(where, command):
    args = shlex.split(command)
    if any("..." in a for a in args):
        pytest.skip("an elided command")
    try:
        name, params = _parse(args)
    except click.ClickException as e:
        pytest.fail(f"{where}: `envace-lite {command}`: {e.format_message()}")
    if params.get("profile") and "<" not in params["profile"]:
        assert params["profile"] in PROFILES, f"{where}: unknown profile {params['profile']!r}"
    sets = [b for a, b in zip(args, args[1:]) if a == "--set"]
    sets += [a.removeprefix("--set=") for a in args if a.startswith("--set=")]
    for item in sets:  # every --set names a field by its current key
        key = item.partition("=")[0]
        assert key not in MOVED_KEYS, f"{where}: --set {key}: write {MOVED_KEYS[key]}"
        try:
            field_type(key)
        except ConfigError as e:
            pytest.fail(f"{where}: `envace-lite {command}`: {e}")
    if name == "notebooks":
        only = [s.strip() for s in (params["only"] or "").split(",") if s.strip()] or None
        paths = select(discover(), only)
        # a value the reader supplies (<folder>, /path/to/...) is no literal path to check
        items = [p for p in params["param"] if "<" not in p and "/path/" not in p]
        extra = parse_notebook_params(items)
        try:
            check_series_params(paths, extra)
        except ConfigError as e:
            pytest.fail(f"{where}: `envace-lite {command}`: {e}")


def test_a_misspelled_documented_parameter_is_caught():
    """The old instructors' command (02 has no ``task_index``) fails the same check."""
    paths = select(discover(), ["00", "02"])
    with pytest.raises(ConfigError, match="task_id"):
        check_series_params(paths, {"02": {"task_index": 3}})
