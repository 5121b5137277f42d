import pytest

from fluidpd.core.piece import PrefillPiece, split_prompt
from fluidpd.core.request import Request


def test_split_covers_the_prompt_in_order_and_each_piece_attends_to_what_precedes_it():
    req = Request(7, 0.0, 1003, 10)
    pieces = split_prompt(req, 4)
    assert [p.length for p in pieces] == [251, 251, 251, 250]
    assert [p.offset for p in pieces] == [0, 251, 502, 753]
    p = pieces[2]
    p.prefilled = 100
    assert p.kv_prior == 602 and p.prefill_remaining == 151 and p.id == 7
    with pytest.raises(ValueError):
        split_prompt(req, 0)
    with pytest.raises(ValueError):
        PrefillPiece(req, 900, 200)
