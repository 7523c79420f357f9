"""The grouped read (router/backends/grouping.py) with an in-process reader: the combined read
recovers a known distribution over every option; the chained read keeps one group only."""

from __future__ import annotations

import math
import random

import pytest

from policies.types import DecisionRequest, Option, OptionScores
from router.backends.grouping import grouped_read, split_groups


def options(n: int) -> tuple[Option, ...]:
    return tuple(Option(f"opt{i:04d}") for i in range(n))


def true_distribution(n: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    weights = [rng.random() ** 4 for _ in range(n)]
    total = math.fsum(weights)
    return {f"opt{i:04d}": w / total for i, w in enumerate(weights)}


class ExactReader:
    """Answers any question from a known distribution over the base options: an option is
    itself, a group option is the mass of the options its description names. It records the
    size of every question it was asked."""

    def __init__(self, truth: dict[str, float]) -> None:
        self.truth = truth
        self.sizes: list[int] = []

    def mass(self, option: Option) -> float:
        if option.name in self.truth:
            return self.truth[option.name]
        assert option.description and option.description.startswith("one of: ")
        names = option.description.removeprefix("one of: ").split(", ")
        return math.fsum(self.truth[n] for n in names)  # groups always name base options

    async def __call__(self, request: DecisionRequest) -> OptionScores:
        self.sizes.append(len(request.options))
        masses = [self.mass(o) for o in request.options]
        total = math.fsum(masses)
        return OptionScores(request.option_names, tuple(m / total for m in masses))


def test_split_groups_is_contiguous_balanced_and_within_the_cap() -> None:
    groups = split_groups(options(77), max_options=26)
    assert [len(g) for g in groups] == [26, 26, 25]
    assert [o for g in groups for o in g] == list(options(77))
    assert [len(g) for g in split_groups(options(77), max_options=26, group_size=9)] == [9] * 5 + [8] * 4
    with pytest.raises(ValueError, match="max_options"):
        split_groups(options(5), max_options=1)
    with pytest.raises(ValueError, match="group_size"):
        split_groups(options(5), max_options=4, group_size=1)


@pytest.mark.parametrize(("n", "cap"), [(27, 26), (77, 26), (77, 9), (1000, 26)])
async def test_combined_read_recovers_the_full_distribution(n: int, cap: int) -> None:
    truth = true_distribution(n, seed=n)
    reader = ExactReader(truth)
    request = DecisionRequest("q", "Which?", options(n), "state")
    scores = await grouped_read(request, reader, max_options=cap)
    assert scores.options == request.option_names
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert max(abs(p - truth[o]) for o, p in scores.as_dict().items()) < 1e-12
    assert max(reader.sizes) <= cap  # every read stayed within the server's limit
    assert min(scores.proba) > 0  # no option is lost


async def test_combined_read_takes_group_mass_times_conditional() -> None:
    """With a group question that disagrees with the members' mass, the product rule is what
    combines them: P(o) = P(g) * P(o | g)."""
    async def reader(request: DecisionRequest) -> OptionScores:
        if request.option_names[0].startswith("group_"):
            return OptionScores(request.option_names, (0.7, 0.3))
        k = len(request.options)
        return OptionScores(request.option_names, tuple([1.0 / k] * k))

    request = DecisionRequest("q", "Which?", options(30), "state")
    scores = await grouped_read(request, reader, max_options=26)
    assert scores.proba[0] == pytest.approx(0.7 / 15) and scores.proba[-1] == pytest.approx(0.3 / 15)
    assert scores.raw["grouped"]["group_proba"] == [0.7, 0.3]


async def test_chained_read_keeps_only_the_chosen_group() -> None:
    truth = true_distribution(77, seed=3)
    reader = ExactReader(truth)
    request = DecisionRequest("q", "Which?", options(77), "state")
    scores = await grouped_read(request, reader, max_options=26, mode="chained")
    groups = split_groups(request.options, max_options=26)
    masses = [math.fsum(truth[o.name] for o in g) for g in groups]
    chosen = max(range(len(groups)), key=masses.__getitem__)
    kept = {o.name for o in groups[chosen]}
    assert {o for o, p in scores.as_dict().items() if p > 0} == kept
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert len(reader.sizes) == 2


async def test_unknown_mode_is_refused() -> None:
    async def reader(request: DecisionRequest) -> OptionScores:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="mode"):
        await grouped_read(DecisionRequest("q", "?", options(30), "s"), reader, max_options=26,
                           mode="lossy")  # type: ignore[arg-type]
