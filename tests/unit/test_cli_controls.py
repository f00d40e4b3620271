"""Human-readable CLI output never passes a terminal control through
(docs/contract.md#control-characters): an OSC 52 clipboard write, an erase-line and a
carriage-return overwrite planted in a URL or a workflow name are printed as visible escapes;
--output json is left as it was."""

from __future__ import annotations

import argparse
import json

import pytest

from flowforge.cli.output import emit, printable

HOSTILE = "https://x.example/\x1b]52;c;ZXZpbA==\x07\x1b[2K\rsucceeded\x9b31m\x7f"


def test_controls_are_shown_not_obeyed() -> None:
    shown = printable(f"url: {HOSTILE}\nname\tok")
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert "\\x1b]52;c;ZXZpbA==\\x07\\x1b[2K\\x0dsucceeded\\x9b31m\\x7f" in shown
    assert shown.endswith("\nname\tok")


def test_emit_escapes_text_and_leaves_json_alone(capsys: pytest.CaptureFixture[str]) -> None:
    emit(argparse.Namespace(format="text"), {"url": HOSTILE}, lambda: f"url {HOSTILE}")
    assert "\x1b" not in capsys.readouterr().out
    emit(argparse.Namespace(format="json"), {"url": HOSTILE}, "unused")
    assert json.loads(capsys.readouterr().out) == {"url": HOSTILE}
