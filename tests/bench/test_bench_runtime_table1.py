"""runtime_table1.py's shifting regime: the phase_shift window it writes and evaluates."""

import pytest
from benchscript import load

from fluidpd.bench.capacity import Window


@pytest.fixture(scope="module")
def runtime_table1():
    return load("runtime_table1")  # it puts benchmarks/simulation/ on sys.path for sim_fidelity


def test_the_phase_shift_window_is_the_fifth_cycle_with_the_fourth_as_its_history(runtime_table1, tmp_path):
    spec, duration = runtime_table1.phase_shift_window(tmp_path, 5.0)
    assert (tmp_path / "phase_shift.csv").is_file() and duration == 10.0
    window, rate = Window.parse(spec, duration)
    assert (window.start_s, window.span_s, rate) == (40.0, 10.0, 1.0)
    evaluated, history = window.at(1.0), window.before().at(1.0)
    for trace in (evaluated, history):
        half = trace.arrival_s < 5.0  # the surge, then the wave
        assert half.any() and (~half).any()
        assert trace.prompt_len[half].mean() > 1.5 * trace.prompt_len[~half].mean()
        assert trace.output_len[~half].mean() > 4 * trace.output_len[half].mean()
