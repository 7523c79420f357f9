"""How the ``slotgate`` commands' help names values: plain metavars (``--log <path>``,
``--limit <int>``) where typer prints Python types (``<list[Path]>``, ``<int range>``), and
arguments by name in the usage line (``A B``, not ``{a} {b}``)."""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperOption

# A repeatable option shows its one value's type (its help says it repeats); a bounded number
# shows its type, its bounds being in the help's brackets ([x>=1]).
_LIST = re.compile(r"<list\[(.+)\]>")
_RANGE = re.compile(r"<(\w+) range>")


def plain_metavar(shown: str) -> str:
    """typer's display of a value's type, made plain: ``<list[Path]>`` -> ``<path>``,
    ``<int range>`` -> ``<int>``; any other display as it is."""
    shown = _LIST.sub(lambda m: f"<{m.group(1).lower()}>", shown)
    return _RANGE.sub(r"<\1>", shown)


class PlainHelp(TyperCommand):
    """A command whose help shows plain metavars (``plain_metavar``) for options that do not
    set their own, and each argument in the usage line by its metavar, else its name in
    capitals (``[A]`` when optional)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        for param in self.get_params(ctx):
            if isinstance(param, TyperOption) and param.metavar is None and not param.is_flag:
                param.metavar = plain_metavar(param.display_type(ctx))
        super().format_options(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar or str(param.name).upper()
                pieces.append((name if param.required else f"[{name}]")
                              + ("..." if param.nargs != 1 else ""))
        return pieces
