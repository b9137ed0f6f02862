"""What a kernel says of its waiting cell (held.py, ``cell:``) is the student's: checked in one place, anything else
is dropped, and the API shows nothing from it."""

from __future__ import annotations

import json

import pytest

from jupyter_gpushare.launch.held import _cell

GOOD = {"msg_id": "a1b2-c3", "hash": "8c1b558e", "count": 3}


def said(**fields) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


def test_a_well_formed_cell_is_taken():
    assert _cell(said()) == GOOD
    assert _cell(said(count=None)) == {**GOOD, "count": None}


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b"null",
        said(msg_id=""),
        said(msg_id="x" * 101),
        said(msg_id="line\nbreak"),
        said(msg_id=7),
        said(hash="8C1B558E"),
        said(hash="8c1b558"),
        said(hash="zzzzzzzz"),
        said(hash="é" * 8),
        said(count=True),
        said(count=-1),
        said(count=10**12),
        said(count=1.5),
        said(count="3"),
        b'{"msg_id": "a", "hash": "8c1b558e", "count": NaN}',
    ],
)
def test_anything_else_a_kernel_says_of_its_cell_is_dropped(raw):
    assert _cell(raw) is None
