"""The phase a run has entered, for a supervisor (sync/phase.py): one line, replaced
atomically, owner-only; nothing written when no file is named."""

from __future__ import annotations

import stat

from sync.phase import PHASE_FILE, Phase, enter


def test_each_phase_replaces_the_line_owner_only(tmp_path, monkeypatch):
    marker = tmp_path / "phase"
    monkeypatch.setenv(PHASE_FILE, str(marker))
    enter(Phase.RECONCILE, "Claims")
    assert marker.read_text() == "reconcile Claims\n"
    enter(Phase.PUBLISH)
    assert marker.read_text() == "publish \n"
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["phase"]  # no partial file left


def test_nothing_is_written_without_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv(PHASE_FILE, raising=False)
    monkeypatch.chdir(tmp_path)
    enter(Phase.LOAD, "Patients")
    assert list(tmp_path.iterdir()) == []
