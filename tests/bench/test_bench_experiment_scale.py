"""`fluidpd experiment scale`: Table 1's systems on growing clusters at the same load per GPU."""

import json

import pytest

from fluidpd.bench.experiments.scale.run import ScaleSetting, run_scale, scaled_split


def test_scale_runs_every_size_at_the_same_load_per_gpu_and_reports_what_the_issue_asks(tmp_path, capsys):
    from fluidpd.cli import main

    args = ["--gpus", "8,16", "--window", "15", "--min-requests", "150", "--out", str(tmp_path)]
    assert main(["experiment", "scale", *args, "--systems", "static-pd 2P:6D,fluidpd"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "scale.json").read_text())
    assert (tmp_path / "scale.png").stat().st_size > 0
    assert list(res["sizes"]) == ["8", "16"]
    small, large = res["sizes"]["8"], res["sizes"]["16"]
    assert small["window_s"] > large["window_s"] >= 15  # the small cluster's window holds min_requests
    for size in (small, large):
        assert size["rate"] == pytest.approx(0.32 * size["gpus"], rel=0.01)
        assert set(size["systems"]) == {"static-pd 2P:6D", "fluidpd"}
        for r in size["systems"].values():
            assert 0 <= r["strict_attainment"] <= r["attainment"] <= 1
            assert r["goodput_per_gpu"] == pytest.approx(r["attainment"] * size["rate"] / size["gpus"])
            assert r["kv_bytes_cross_node"] <= r["kv_bytes_moved"]
        assert size["systems"]["static-pd 2P:6D"]["prefill_workers"] == size["gpus"] // 4
        assert size["systems"]["static-pd 2P:6D"]["ticks"] == 0  # a static split has no periodic control
        assert size["systems"]["fluidpd"]["ticks"] > 0 and size["systems"]["fluidpd"]["control_cpu_per_cycle_ms"] > 0
    assert large["systems"]["static-pd 2P:6D"]["kv_bytes_cross_node"] > 0  # 16 GPUs are two nodes
    assert small["systems"]["fluidpd"]["kv_bytes_cross_node"] == 0  # 8 GPUs are one
    assert res["goal"]["met"] == (res["goal"]["ratio"] >= 0.95)
    assert out.splitlines()[-1].startswith("headline: fluidpd goodput per GPU")


def test_a_split_keeps_its_share_and_both_roles():
    assert [scaled_split(2, n) for n in (8, 64, 1024)] == [2, 16, 256]
    assert scaled_split(7, 2) == 1 and scaled_split(1, 2) == 1


def test_every_size_is_offered_the_same_load_per_gpu_by_populations_that_grow_with_it():
    s = ScaleSetting(window_s=30.0, min_requests=1)
    for gpus in (8, 64):
        assert len(s.trace(gpus)) == round(0.32 * gpus * s.window(gpus))  # exactly rate x span
        assert s.trace(gpus, seed=1).arrival_s.tolist() != s.trace(gpus).arrival_s.tolist()
    assert s.window(8) == 30.0 and ScaleSetting(window_s=30.0, min_requests=1000).window(8) == pytest.approx(
        1000 / 2.56
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "1"], "at least 2 GPUs"),
        (["--systems", "nope"], "unknown system"),
        (["--source", "nope"], "invalid choice"),
        (["--window", "0"], "must be a finite number > 0"),
    ],
)
def test_bad_arguments_give_a_message_and_exit_2(args, message, capsys):
    from fluidpd.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["experiment", "scale", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_system_in_code_is_a_value_error():
    with pytest.raises(ValueError, match="unknown system"):
        run_scale((8,), ScaleSetting(), ("nope",), progress=False)
