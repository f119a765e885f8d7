"""``--help``'s option panels laid out so that no option name or metavar is ever cut.

Typer's panels put every name (``--x``, ``-x``, ``--no-x``, ``-X``), the metavar and the help in
columns of one table that Rich shrinks evenly once a terminal is narrower than the longest row:
at 80 columns ``--global-batch-size`` showed as ``--global-batch-si…``.  Here the names share one
column, the negative form of a flag on its own line, and that column and the metavar's are as
wide as their longest entry; only the help column gives way, wrapping its words and folding a
word longer than the column rather than cutting it.  Installed once by the app for every
command; the rest of the help (usage, text, command panels, epilog) stays Typer's.  It stands in
for Typer's private ``rich_utils._print_options_panel`` (same signature, Typer 0.29) and uses its
helpers: tests/flows/test_cli_help.py fails if a Typer upgrade changes them.
"""

from __future__ import annotations

import functools
from typing import Any

from typer import core

_INSTALLED = "_sailor_wrapping_panels"
_PANEL_FRAME = 4  # the panel's border and its padding, both sides
_MIN_HELP_WIDTH = 16
# What of typer.rich_utils (private, Typer 0.29) the panels use: checked before they stand in.
_TYPER_HELPERS = (
    "_print_options_panel", "_get_parameter_help", "highlighter", "negative_highlighter", "types_highlighter",
    "ALIGN_OPTIONS_PANEL", "RANGE_STRING", "REQUIRED_SHORT_STRING", "STYLE_OPTIONS_PANEL_BORDER",
    "STYLE_OPTIONS_TABLE_BORDER_STYLE", "STYLE_OPTIONS_TABLE_BOX", "STYLE_OPTIONS_TABLE_LEADING",
    "STYLE_OPTIONS_TABLE_PADDING", "STYLE_OPTIONS_TABLE_PAD_EDGE", "STYLE_OPTIONS_TABLE_ROW_STYLES",
    "STYLE_OPTIONS_TABLE_SHOW_LINES", "STYLE_REQUIRED_SHORT", "STYLE_TYPES",
)  # narrower, the help goes under the names instead of beside them


def install() -> None:
    """Render every command's help with these panels.  Rich's help machinery is imported only
    when a help is printed, so the CLI still starts light."""
    for cls in (core.TyperCommand, core.TyperGroup):
        if getattr(cls.format_help, _INSTALLED, False):
            continue
        cls.format_help = _with_wrapping_panels(cls.format_help)


def _with_wrapping_panels(format_help):
    @functools.wraps(format_help)
    def wrapped(self, ctx, formatter):
        # lazy: typer's Rich help (Rich's markdown, tables, panels) only when a help is printed
        from typer import rich_utils

        if all(hasattr(rich_utils, name) for name in _TYPER_HELPERS):
            rich_utils._print_options_panel = _print_options_panel
        # else: a Typer whose private help helpers differ keeps its own panels (cut, not broken)
        return format_help(self, ctx, formatter)

    setattr(wrapped, _INSTALLED, True)
    return wrapped


def _names(param: Any, *, secondary: bool) -> str:
    """The option's names of one form (``--x, -x`` or ``--no-x``); an argument's display name."""
    opts = param.secondary_opts if secondary else param.opts
    if isinstance(param, core.TyperArgument):
        name = param.display_name_raw
        if param.metavar is None and param.nargs != 1:
            name += "..."
        return name if opts else ""
    return ", ".join(sorted(opts, key=lambda o: not o.startswith("--")))


def _names_cell(param: Any):
    # lazy: Rich's types, with typer.rich_utils (imported by the caller, only when a help is printed)
    from rich.text import Text
    from typer import rich_utils as ru

    cell = Text(no_wrap=True)
    cell.append_text(ru.highlighter(_names(param, secondary=False)))
    negative = _names(param, secondary=True)
    if negative:
        cell.append("\n")
        cell.append_text(ru.negative_highlighter(negative))
    return cell


def _type_cell(param: Any, ctx: Any):
    # lazy: as _names_cell
    from rich.text import Text
    from typer import rich_utils as ru

    text = Text(style=ru.STYLE_TYPES, no_wrap=True)
    shown = param.display_type_rich(ctx=ctx)
    if shown is not None:
        text.append(shown)
    number_range = param._get_number_range_help_str()
    if number_range:
        text.append(ru.RANGE_STRING.format(number_range))
    return ru.types_highlighter(text)


def _help_cell(param: Any, ctx: Any, markup_mode: Any):
    """Typer's help of the option (text, default, required) with a word too long for the column
    folded onto the next line: Rich's Columns, which lays these out, would cut it to "…"."""
    # lazy: as _names_cell
    from rich.text import Text
    from typer import rich_utils as ru

    cell = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
    for item in cell.renderables:
        if isinstance(item, Text):
            item.overflow = "fold"
    return cell


def _print_options_panel(*, name: str, params: list, ctx: Any, markup_mode: Any, console: Any) -> None:
    """Typer's ``rich_utils._print_options_panel`` with the layout above (same signature)."""
    if not params:
        return
    # lazy: as _names_cell
    from rich import box
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils as ru

    names = [_names_cell(p) for p in params]
    types = [_type_cell(p, ctx) for p in params]
    helps = [_help_cell(p, ctx, markup_mode) for p in params]
    any_required = any(p.required for p in params)
    table = Table(highlight=True, show_header=False, expand=True, box=getattr(box, ru.STYLE_OPTIONS_TABLE_BOX, None),
                  show_lines=ru.STYLE_OPTIONS_TABLE_SHOW_LINES, leading=ru.STYLE_OPTIONS_TABLE_LEADING,
                  border_style=ru.STYLE_OPTIONS_TABLE_BORDER_STYLE, row_styles=ru.STYLE_OPTIONS_TABLE_ROW_STYLES,
                  pad_edge=ru.STYLE_OPTIONS_TABLE_PAD_EDGE, padding=ru.STYLE_OPTIONS_TABLE_PADDING)
    if any_required:
        table.add_column(no_wrap=True, width=1)
    names_width = max(line.cell_len for cell in names for line in cell.split("\n"))
    types_width = max(t.cell_len for t in types)
    _top, right, _bottom, left = Padding.unpack(ru.STYLE_OPTIONS_TABLE_PADDING)
    gaps = (3 if any_required else 2) * (left + right)  # between the columns
    help_width = console.width - _PANEL_FRAME - gaps - (1 if any_required else 0) - names_width - types_width
    if help_width >= _MIN_HELP_WIDTH:
        # A fixed width and no wrapping: Rich takes a narrow terminal's lack of room from the help alone.
        table.add_column(no_wrap=True, width=names_width)
        table.add_column(no_wrap=True, width=types_width)
        table.add_column(overflow="fold", ratio=1)
        rows = [[names[i], types[i], helps[i]] for i in range(len(params))]
    else:  # too narrow for the help beside the names: under them, indented
        table.add_column(overflow="fold", ratio=1)
        rows = [[Group(Text.assemble(names[i], "  ", types[i]), Padding(helps[i], (0, 0, 0, 4)))]
                for i in range(len(params))]
    for param, row in zip(params, rows, strict=True):
        required = Text(ru.REQUIRED_SHORT_STRING, style=ru.STYLE_REQUIRED_SHORT) if param.required else Text("")
        table.add_row(*([required, *row] if any_required else row))
    console.print(Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name,
                        title_align=ru.ALIGN_OPTIONS_PANEL))
