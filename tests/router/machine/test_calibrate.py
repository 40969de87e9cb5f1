"""gamma calibration: a damaged gamma file is named and measured again, implausible timings are refused (router/machine/calibrate.py)."""

import pytest


def test_a_damaged_gamma_file_is_named_and_calibrated_again(tmp_path, capsys):
    from eval.gamma import _earlier_choice

    path = tmp_path / "gamma.json"
    assert _earlier_choice(path) is None
    for damaged in ('{"gamma": 3', "[1, 2]", '{"gamma": 3}'):
        path.write_text(damaged)
        assert _earlier_choice(path) is None
        assert f"{path} is damaged" in capsys.readouterr().out


def test_calibration_refuses_implausible_timings_and_measures_again(monkeypatch, capsys, tiny):
    """Under contention a 9-token verifier pass was once timed at 1 ms beside a 1-token pass of 16 ms,
    and gamma 8 was chosen from that: implausible timings are measured again, then refused."""
    from router.machine import calibrate

    assert calibrate.implausible_costs(0.004, [0.016, 0.018, 0.020]) is None
    assert calibrate.implausible_costs(0.004, [0.016, 0.015, 0.017]) is None  # within noise
    assert "pass over 9 tokens took 1.0 ms" in calibrate.implausible_costs(0.004, [0.016] * 8 + [0.001])
    assert "not positive" in calibrate.implausible_costs(0.0, [0.016, 0.02])
    curves = iter([[0.016] * 8 + [0.001], [0.016 + 0.002 * n for n in range(9)]])  # contended, then quiet
    monkeypatch.setattr(calibrate, "measure_verify_curve", lambda v, b, n: next(curves))
    drafter, verifier, _ = tiny
    step, verify = calibrate.measure_costs(drafter, verifier, 1, 8)
    assert verify == [0.016 + 0.002 * n for n in range(9)] and "attempt 1: implausible" in capsys.readouterr().out
    monkeypatch.setattr(calibrate, "measure_verify_curve", lambda v, b, n: [0.016] * 8 + [0.001])
    with pytest.raises(ValueError, match="could not measure the pair's costs plausibly in 3 attempts"):
        calibrate.measure_costs(drafter, verifier, 1, 8)
