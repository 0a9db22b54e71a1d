"""Statistics the benchmark scripts share (imported by their embedded Python)."""
import random
import statistics


def ratio_interval(ratios, confidence=0.90, resamples=2000, seed=1):
    """The median of per-round ratios and a bootstrap interval for it (the rounds resampled
    with replacement, a fixed seed so a report reads the same twice): (median, low, high)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return statistics.median(ratios), meds[int(tail * resamples)], meds[int((1 - tail) * resamples) - 1]
