"""Reading a choice with more options than a server accepts in one question (26 on the vLLM
example server, 128 labels per vLLM slot), by splitting the options into groups.

Combined read (the default): every group question and one question over the groups are read in
parallel, and the answers are combined into one distribution over all options::

    P(option) = P(group(option)) * P(option | group(option))

The assumption, stated because the result depends on it: the group question's probabilities are
taken as the mass of each group, and each within-group read is taken as the conditional
distribution given that group, independent of how the group was chosen (the within-group read
never sees the other groups). Then the products sum to 1 over all options. When the groups
themselves exceed the cap, the group question is read the same way, recursively.
Cost: 1 + (number of groups) reads, all in parallel, against 2 sequential reads for the chain.

Chained read (for comparison only; lossy): read the group question, take its argmax, read only
that group. Options of the other groups get probability 0, so an error at the first step cannot
be recovered and its probabilities are not a distribution over the real alternatives. This is the
ask_if pipeline of the field report, run by the router so it also works on servers that ignore
``ask_if`` (OpenJev).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence

from policies.types import DecisionRequest, Option, OptionScores
from router.backends.options import GroupingMode

ReadOne = Callable[[DecisionRequest], Awaitable[OptionScores]]
GROUP_PROMPT = "Answer with the group whose list holds the answer."


def split_groups(
    options: Sequence[Option], *, max_options: int, group_size: int | None = None
) -> list[tuple[Option, ...]]:
    """Contiguous groups (request order kept), as few as the cap allows, sizes within one of
    each other. ``group_size`` asks for smaller groups (never larger than ``max_options``)."""
    if max_options < 2:
        raise ValueError(f"max_options must be >= 2, got {max_options}")
    size = min(group_size or max_options, max_options)
    if size < 2:  # groups of one would make a group question as large as the original
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    n_groups = math.ceil(len(options) / size)
    base, extra = divmod(len(options), n_groups)
    groups, start = [], 0
    for i in range(n_groups):
        stop = start + base + (1 if i < extra else 0)
        groups.append(tuple(options[start:stop]))
        start = stop
    return groups


def group_request(
    request: DecisionRequest, groups: Sequence[tuple[Option, ...]], *, depth: int = 0
) -> DecisionRequest:
    """The question over the groups: one option per group, naming in its description every base
    option it holds (for a group of groups too, so the model never sees a name it cannot place)."""
    prefix = "group" if depth == 0 else f"group{depth + 1}"  # distinct names at each level
    options = tuple(
        Option(f"{prefix}_{i + 1}", "one of: " + ", ".join(_leaves(o) for o in group))
        for i, group in enumerate(groups)
    )
    instructions = request.instructions if depth else f"{request.instructions} {GROUP_PROMPT}".strip()
    return dataclasses.replace(request, options=options, instructions=instructions)


def _leaves(option: Option) -> str:
    """The base option names a (possibly group) option stands for, as listed in the prompt."""
    if option.name.startswith("group") and (option.description or "").startswith("one of: "):
        return (option.description or "").removeprefix("one of: ")
    return option.name


def member_request(request: DecisionRequest, group: tuple[Option, ...]) -> DecisionRequest:
    return dataclasses.replace(request, options=group)


async def grouped_read(
    request: DecisionRequest,
    read_one: ReadOne,
    *,
    max_options: int,
    mode: GroupingMode = "combined",
    group_size: int | None = None,
) -> OptionScores:
    """Read ``request`` through ``read_one`` (which accepts at most ``max_options`` options)."""
    if mode == "combined":
        return await _combined(request, read_one, max_options=max_options, group_size=group_size)
    if mode == "chained":
        return await _chained(request, read_one, max_options=max_options, group_size=group_size)
    raise ValueError(f"mode must be 'combined' or 'chained', got {mode!r}")


async def _read_small(request: DecisionRequest, read_one: ReadOne) -> OptionScores:
    if len(request.options) == 1:  # nothing to read: one alternative has all the mass
        return OptionScores(request.option_names, (1.0,), {"reads": 0})
    return await read_one(request)


async def _combined(
    request: DecisionRequest, read_one: ReadOne, *, max_options: int, group_size: int | None,
    depth: int = 0,
) -> OptionScores:
    if len(request.options) <= max_options:
        return await _read_small(request, read_one)
    groups = split_groups(request.options, max_options=max_options, group_size=group_size)
    group_scores, *member_scores = await asyncio.gather(
        _combined(group_request(request, groups, depth=depth), read_one,
                  max_options=max_options, group_size=group_size, depth=depth + 1),
        *(_combined(member_request(request, g), read_one, max_options=max_options,
                    group_size=group_size, depth=depth) for g in groups),
    )
    proba = [
        p_group * p_member
        for p_group, members in zip(group_scores.proba, member_scores)
        for p_member in members.proba
    ]
    total = math.fsum(proba)
    raw = {
        "grouped": {
            "mode": "combined",
            "groups": len(groups),
            "group_proba": list(group_scores.proba),
            "reads": 1 + len(groups),
        }
    }
    return OptionScores(request.option_names, tuple(p / total for p in proba), raw)


async def _chained(
    request: DecisionRequest, read_one: ReadOne, *, max_options: int, group_size: int | None,
    depth: int = 0,
) -> OptionScores:
    if len(request.options) <= max_options:
        return await _read_small(request, read_one)
    groups = split_groups(request.options, max_options=max_options, group_size=group_size)
    group_scores = await _chained(
        group_request(request, groups, depth=depth), read_one,
        max_options=max_options, group_size=group_size, depth=depth + 1,
    )
    chosen = group_scores.top_index
    member = await _chained(
        member_request(request, groups[chosen]), read_one,
        max_options=max_options, group_size=group_size, depth=depth,
    )
    within = dict(zip(member.options, member.proba))
    proba = tuple(within.get(name, 0.0) for name in request.option_names)
    raw = {
        "grouped": {
            "mode": "chained",
            "groups": len(groups),
            "group_proba": list(group_scores.proba),
            "chosen_group": chosen,
            "reads": 2,
        }
    }
    return OptionScores(request.option_names, proba, raw)
