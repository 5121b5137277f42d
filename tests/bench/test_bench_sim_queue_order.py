"""sim_queue_order.py's command line: bad scales, workloads and seeds are clear errors."""

import sys

import pytest
from benchscript import load


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--seeds", "0,x"], "--seeds: comma-separated integers"),
        (["--scales", "0"], "--scales must be > 0"),
        (["--workloads", "nope"], "--workloads: choose from"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["sim_queue_order.py", *argv])
    with pytest.raises(SystemExit) as e:
        load("sim_queue_order").main()
    assert e.value.code == 2 and message in capsys.readouterr().err
