"""Every ``envace-lite`` command written in README.md and docs/*.md is one the CLI accepts.

Each command (in a fenced block, continuation lines joined, or in an inline code span) is parsed
by the CLI's own click parser: the subcommand and every option must exist. Its ``--profile`` must
name a profile, each ``--set`` a config field by its key, and a ``notebooks`` command's ``--only`` and ``-p`` must pass the series' own
pre-start check (``check_series_params``: every ``-p`` name against every selected notebook's
parameters cell). Placeholders such as ``<folder>`` and ``DIR`` stand for paths the reader
supplies, so path-valued parameters are checked for existence only when written literally.
"""
from __future__ import annotations

import re
import shlex
import typing
from pathlib import Path

import click
import pytest
from typer.main import get_command

from envace_lite.cli.main import app
from envace_lite.cli.options import parse_notebook_params
from envace_lite.config import ConfigError, field_type
from envace_lite.course.series import discover, select
from envace_lite.course.series_params import check_series_params
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


PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
"""A value the reader supplies, written in capitals (``S``, ``N``, ``DIR``, ``CKPT``)."""


def _fill_placeholders(cmd, args: list[str]) -> list[str]:
    """``args`` with a capitalised placeholder after an integer option replaced by ``1`` (any
    other placeholder is a string or path the option accepts as written)."""
    def is_int(p) -> bool:  # click's own params have ``type``, typer's a ``type_descriptor``
        if getattr(getattr(p, "type", None), "name", "") == "integer":
            return True
        ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
        return ann is int or int in typing.get_args(ann)

    ints = {opt for p in cmd.params if is_int(p) for opt in getattr(p, "opts", [])}
    return [("1" if i and args[i - 1] in ints and PLACEHOLDER.match(a) else a)
            for i, a in enumerate(args)]


def _parse(args: list[str]) -> tuple[str, dict]:
    """``(subcommand, its parsed parameters)`` by click's own parser (nested groups followed).
    A command named with no arguments (prose mentioning ``envace-lite drills report``) is a
    reference: only its subcommand must exist."""
    cmd, ctx, name = get_command(app), None, "envace-lite"
    args = list(args)
    # a group has subcommands (typer carries its own copy of click, so no isinstance check)
    while hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd, info_name=name, parent=ctx)
        while args and args[0].startswith("-"):  # the root's own flags (--debug)
            args.pop(0)
        if not args:
            raise click.UsageError("no subcommand")
        name = args.pop(0)
        sub = cmd.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no such command {name!r}")
        cmd = sub
    if not args:
        return name, {}
    return name, cmd.make_context(name, _fill_placeholders(cmd, args), parent=ctx).params


def test_parse_follows_the_subcommand_and_refuses_an_unknown_option():
    """The parser reaches the subcommand's own options (a root-only parse would accept any)."""
    name, params = _parse(["eval", "--profile", "smoke", "--limit", "2"])
    assert (name, params["profile"], params["limit"]) == ("eval", "smoke", 2)
    assert _parse(["drills", "report"]) == ("report", {})  # a command named in prose
    assert _parse(["experiment", "--seed", "S", "--out", "DIR"])[1]["seed"] == 1
    with pytest.raises(Exception, match="No such option: --bogus"):
        _parse(["eval", "--profile", "smoke", "--bogus", "1"])
    with pytest.raises(click.UsageError, match="no such command 'evaluate'"):
        _parse(["evaluate"])


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_documented_command_parses(where, command):
    args = shlex.split(command)
    if any("..." in a for a in args):
        pytest.skip("an elided command")
    try:
        name, params = _parse(args)
    except Exception as e:  # noqa: BLE001 - click's and typer's own click's usage errors
        if not hasattr(e, "format_message"):
            raise
        pytest.fail(f"{where}: `envace-lite {command}`: {e.format_message()}")
    if params.get("profile") and "<" not in params["profile"] \
            and not PLACEHOLDER.match(params["profile"]):
        assert params["profile"] in PROFILES, f"{where}: unknown profile {params['profile']!r}"
    sets = [b for a, b in zip(args, args[1:]) if a == "--set"]
    sets += [a.removeprefix("--set=") for a in args if a.startswith("--set=")]
    for item in sets:  # every --set names a field by its key
        key = item.partition("=")[0]
        try:
            field_type(key)
        except ConfigError as e:
            pytest.fail(f"{where}: `envace-lite {command}`: {e}")
    if name == "notebooks" and params:  # a reference names no options
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
