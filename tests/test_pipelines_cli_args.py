"""The command line refuses what cannot run before any run starts, and explains every option."""

from __future__ import annotations

import argparse

import pytest

from cli.main import build_parser, main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["sync", "--backfill-to", "2026-10-07"], "--backfill-from"),
        (["sync", "--backfill-from", "2026-10-32"], "--backfill-from"),
        (["sync", "--backfill-from", "2026-10-07", "--backfill-to", "2026-10-01"], "--backfill-to"),
        (["sync", "--full", "--backfill-from", "2026-10-07"], "--full"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, named, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "backfill_" not in err  # the flag, never the internal config key
    assert len(err.splitlines()) <= 6
    assert not (tmp_path / "data").exists()  # nothing started


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--customers", "2", "--api-key", "k"], "--api-key"),
        (["--tenants-file", "t.toml", "--client-secret", "s"], "--client-secret"),
    ],
)
def test_a_fixed_credential_beside_several_customers_exits_2(argv, named, capsys):
    """`--client-secret` and `--api-key` are the one customer's: with several customers they
    would be served to nobody, so the sandbox refuses them before it draws any data."""
    with pytest.raises(SystemExit) as stopped:
        main(["sandbox", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"{named} fix the one customer's credentials" in err
    assert len(err.splitlines()) <= 20  # argparse's usage of `sandbox`, then the one line


def _leaves(parser: argparse.ArgumentParser, name: str = "clinical-sync"):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield name, parser
    for action in subs:
        for child_name, child in action.choices.items():
            yield from _leaves(child, f"{name} {child_name}")


def test_every_option_has_help_text():
    missing = [
        f"{name} {action.dest}"
        for name, parser in _leaves(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert missing == []


def test_a_step_out_of_memory_is_told_to_raise_the_cap():
    """DuckDB's error under WAREHOUSE_MEMORY_LIMIT (a models step joining large tables needs
    more as the data grows) names the variable to raise."""
    import duckdb

    from cli.log import advice

    assert "WAREHOUSE_MEMORY_LIMIT" in advice(duckdb.OutOfMemoryException.__name__)
