"""A test owns its data: nothing it runs reads or writes the checkout's .data (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.runtime.embedded_redis import data_dir
from agent.tools.notes import add_note, notes_path, read_notes
from tests.conftest import ROOT

WHERE = "from agent.tools.notes import notes_path; from agent.runtime.embedded_redis import data_dir; " \
        "print(data_dir().resolve()); print(notes_path().resolve())"


def _outside_the_checkout(path) -> bool:
    return not path.resolve().is_relative_to(ROOT)


def test_the_data_directory_and_the_notes_are_outside_the_checkout(own_data_dir):
    assert data_dir() == own_data_dir
    assert _outside_the_checkout(data_dir()) and _outside_the_checkout(notes_path())


def test_a_process_a_test_starts_keeps_its_data_outside_the_checkout():
    lines = subprocess.run([sys.executable, "-c", WHERE], cwd=ROOT, capture_output=True, text=True,
                           check=True, timeout=60).stdout.splitlines()
    assert len(lines) == 2 and all(not line.startswith(str(ROOT)) for line in lines), lines


@pytest.mark.parametrize("turn", ["first", "second"])
def test_a_note_one_test_adds_is_not_in_the_next_tests_notes(turn):
    assert read_notes() == []  # the page's sidebar would show a Notes block
    add_note(f"written by the {turn} test")
    assert read_notes()[-1].endswith(f"written by the {turn} test")
