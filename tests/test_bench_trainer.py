"""``python -m lightning_adv.bench_trainer`` runs and reports every phase (one step each)."""

from lightning_adv.bench_trainer import PHASES, report, run_config


def test_trainer_benchmark_times_every_phase():
    new = run_config("turn_gae", steps=1, baseline=False)
    old = run_config("turn_gae", steps=1, baseline=True)
    for timings in (new, old):
        assert set(PHASES) <= set(timings)
        assert sum(timings[p] for p in PHASES) <= timings["step"] * 1.01
    text = report("turn_gae", 1, old, new)
    assert "steps/s" in text and all(p in text for p in PHASES)
