"""Drawing :func:`~lightning_adv.visualize.advantage_heatmap`'s figure with matplotlib.

Importing this module imports matplotlib (the ``plot`` extra). The figure is made without
``pyplot`` (no global figure registry to leak into, no GUI backend): a ``Figure`` on an
Agg canvas, drawn once, its pixels read back.

Layout, in inches: a title line; per response a label line, then its wrapped lines of
token cells, each line followed by one thin strip per extra quantity; the colour bars on
the right. Horizontal positions inside the token area are in character units.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from lightning_adv.visualize.heatmap_data import QUANTITIES, Heatmap, Response, TokenCell

CHAR = 0.07            # inches per character unit (DejaVu Sans Mono at 8 pt advances 0.067)
TOKEN_H = 0.24         # a line of token cells
STRIP_H = 0.09         # a strip under it
LINE_GAP = 0.05
LABEL_H = 0.22
RESPONSE_GAP = 0.14
TITLE_H = 0.36
GUTTER = 0.5           # left of the cells: the strips' names
BAR_W, BAR_GAP = 0.13, 0.85
MAX_TOKEN_CHARS = 12
MIN_WIDTH = 32          # characters: room for the labels
ENVIRONMENT = (0.82, 0.82, 0.82)
SEGMENT = (0.0, 0.62, 0.23)   # the mark starting a tree segment (turn bars are black)
SEPARATOR = "0.55"            # the line between tree groups
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


@dataclass(frozen=True)
class Placed:
    """A token cell: its position and where it goes (line of its response, x in chars)."""

    position: int
    line: int
    x: float
    width: float
    text: str


@dataclass(frozen=True)
class Colouring:
    """What every response of one figure is drawn with: the strips under each line, each
    quantity's scale and colour map, and the height of a line of cells with its strips."""

    strips: tuple[str, ...]
    norms: dict[str, Normalize]
    maps: dict[str, Any]
    line_h: float


def display_text(text: str) -> str:
    """A token's text as drawn: whitespace made visible, control characters as ``�``,
    long texts cut with ``…``, an empty text as ``∅``."""
    shown = "".join(VISIBLE.get(c, c if c.isprintable() else "�") for c in text) or "∅"
    return shown if len(shown) <= MAX_TOKEN_CHARS else shown[: MAX_TOKEN_CHARS - 1] + "…"


def place(response: Response, width: int) -> list[Placed]:
    """Cells left to right, a token that does not fit on the line starting the next one."""
    placed, line, x = [], 0, 0.0
    for i in response.positions:
        text = display_text(response.tokens[i])
        w = len(text) + 1.0
        if x > 0 and x + w > width:
            line, x = line + 1, 0.0
        placed.append(Placed(i, line, x, w, text))
        x += w
    return placed


def draw(responses: list[Response], scales: dict[str, tuple[float, float]],
         title: str | None, width: int, dpi: int) -> Heatmap:
    """The figure of ``responses`` wrapped at ``width`` characters, each quantity of
    ``scales`` (its name -> the ends of its colour scale)."""
    strips = [name for name in scales if name != "advantage"]
    line_h = TOKEN_H + STRIP_H * len(strips) + LINE_GAP
    layouts = [place(r, width) for r in responses]
    heights = [LABEL_H + line_h * (1 + max((p.line for p in cells), default=0)) + RESPONSE_GAP
               for cells in layouts]
    content_h = max(sum(heights), 1.2)
    # as wide as the longest line, label or title (short responses make a narrow image); a
    # bold 8 pt character is about as wide as a character unit, a 9 pt one 1.15
    width = max([MIN_WIDTH] + [c.x + c.width for cells in layouts for c in cells]
                + [len(label_text(r, len(cells))) for r, cells in zip(responses, layouts)]
                + [1.15 * len(title or "") - GUTTER / CHAR])
    cells_w = width * CHAR
    fig_w = 0.1 + GUTTER + cells_w + 0.25 + len(scales) * (BAR_W + BAR_GAP)
    fig_h = TITLE_H + content_h + 0.1
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes([(0.1 + GUTTER) / fig_w, 0.1 / fig_h, cells_w / fig_w, content_h / fig_h])
    ax.set_xlim(0, width)
    ax.set_ylim(content_h, 0)  # y in inches, down
    ax.set_axis_off()
    norms = {name: Normalize(low, high) for name, (low, high) in scales.items()}
    maps = {name: colormaps[QUANTITIES[name].colour_map] for name in scales}
    colouring = Colouring(tuple(strips), norms, maps, line_h)
    drawn: list[tuple[int, Response, Placed, float]] = []
    patches = Patches()
    top = 0.0
    for b, (response, cells, height) in enumerate(zip(responses, layouts, heights)):
        if response.new_tree and b:
            middle = top - RESPONSE_GAP / 2
            patches.separators.append([(0, middle), (width, middle)])
        # a tree's tokens that an earlier row drew keep their places, empty
        cells = [cell for cell in cells if cell.position >= response.drawn_before]
        _draw_response(ax, patches, colouring, response, cells, top)
        drawn.extend((b, response, cell, top + LABEL_H + cell.line * line_h) for cell in cells)
        top += height
    patches.add_to(ax)
    if title:
        fig.text(0.1 / fig_w, 1 - 0.22 / fig_h, title, fontsize=9, weight="bold",
                 parse_math=False)
    _colour_bars(fig, scales, norms, maps, fig_w, fig_h, cells_w)
    with warnings.catch_warnings():
        # A token whose character the font lacks is drawn as a box; one warning per
        # character would say nothing more.
        warnings.filterwarnings("ignore", "Glyph .* missing", UserWarning)
        canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    boxes = tuple(_cell_box(ax, b, response, cell, y, image.shape[0])
                  for b, response, cell, y in drawn)
    return Heatmap(figure=fig, image=image, limit=scales["advantage"][1], cells=boxes)


class Patches:
    """The cells' rectangles, fill colours and edge widths, the turn bars, the tree segment
    marks and the lines between trees: each kind drawn as one collection."""

    def __init__(self) -> None:
        self.rectangles: list[Rectangle] = []
        self.colours: list[tuple] = []
        self.widths: list[float] = []
        self.bars: list[list[tuple[float, float]]] = []
        """the turn bars' end points"""
        self.segments: list[list[tuple[float, float]]] = []
        self.separators: list[list[tuple[float, float]]] = []

    def add(self, x: float, y: float, w: float, h: float, colour: tuple, width: float) -> None:
        self.rectangles.append(Rectangle((x, y), w, h))
        self.colours.append(colour)
        self.widths.append(width)

    def add_to(self, ax) -> None:
        # one collection each: adding hundreds of patches one by one costs more than
        # drawing them
        ax.add_collection(PatchCollection(self.rectangles, facecolors=self.colours,
                                          edgecolors="white", linewidths=self.widths, zorder=1))
        ax.add_collection(LineCollection(self.bars, colors="black", linewidths=2.0,
                                         capstyle="butt", zorder=2))
        ax.add_collection(LineCollection(self.segments, colors=[SEGMENT], linewidths=1.5,
                                         capstyle="butt", zorder=3))
        ax.add_collection(LineCollection(self.separators, colors=SEPARATOR, linewidths=0.8,
                                         zorder=2))


def _draw_response(ax, patches: Patches, colouring: Colouring, response: Response,
                   cells: list[Placed], top: float) -> None:
    strips, norms, maps, line_h = (colouring.strips, colouring.norms, colouring.maps,
                                   colouring.line_h)
    ax.text(0, top + LABEL_H * 0.7, label_text(response, len(response.positions)), fontsize=8,
            weight="bold", parse_math=False)
    if not response.positions:
        ax.text(0, top + LABEL_H + TOKEN_H * 0.7, "(no generated token)", fontsize=8,
                style="italic", parse_math=False)
    lines = {cell.line for cell in cells}
    for line in lines:
        y = top + LABEL_H + line * line_h
        for k, name in enumerate(strips):
            ax.text(-0.4, y + TOKEN_H + STRIP_H * (k + 0.8), QUANTITIES[name].short, fontsize=5.5,
                    ha="right", color="0.3", parse_math=False)
    for cell in cells:
        y = top + LABEL_H + cell.line * line_h
        i = cell.position
        generated = response.generated[i]
        color = maps["advantage"](norms["advantage"](response.advantages[i])) if generated \
            else ENVIRONMENT
        patches.add(cell.x, y, cell.width, TOKEN_H, color, 0.6)
        ax.text(cell.x + cell.width / 2, y + TOKEN_H * 0.55, cell.text, fontsize=8,
                family="DejaVu Sans Mono", ha="center", va="center", parse_math=False,
                color=_ink(color) if generated else "0.35")
        for k, name in enumerate(strips):
            value = response.strips[name][i]
            fill = maps[name](norms[name](value)) if generated else ENVIRONMENT
            patches.add(cell.x, y + TOKEN_H + STRIP_H * k, cell.width, STRIP_H, fill, 0.3)
        if i in response.turn_starts:
            patches.bars.append([(cell.x, y - 0.02), (cell.x, y + line_h - LINE_GAP + 0.02)])
        if i in response.segment_starts:
            patches.segments.append([(cell.x, y - 0.04), (cell.x, y + TOKEN_H + 0.04)])


def label_text(response: Response, shown: int) -> str:
    if not response.hidden:
        return response.label
    return f"{response.label} (first {shown} tokens; {response.hidden} more not shown)"


def _ink(color: tuple) -> str:
    """Black text on light cells, white on dark ones."""
    r, g, b = color[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _colour_bars(fig: Figure, scales: dict, norms: dict, maps: dict, fig_w: float,
                 fig_h: float, cells_w: float) -> None:
    content_h = fig_h - TITLE_H - 0.1
    bar_h = min(content_h, 2.2)
    x = 0.1 + GUTTER + cells_w + 0.25
    for name in scales:
        bottom = 0.1 + content_h - bar_h
        cax = fig.add_axes([x / fig_w, bottom / fig_h, BAR_W / fig_w, bar_h / fig_h])
        bar = fig.colorbar(ScalarMappable(norm=norms[name], cmap=maps[name]), cax=cax)
        bar.set_label(name, fontsize=8)
        bar.ax.tick_params(labelsize=7)
        x += BAR_W + BAR_GAP


def _cell_box(ax, row: int, response: Response, cell: Placed, y: float,
              height: int) -> TokenCell:
    """The cell's record: its pixel box in the image (y down), rounded inwards."""
    (x0, y0), (x1, y1) = ax.transData.transform([(cell.x, y + TOKEN_H), (cell.x + cell.width, y)])
    box = (int(np.ceil(x0)), int(np.ceil(height - y1)), int(np.floor(x1)), int(np.floor(height - y0)))
    i = cell.position
    return TokenCell(row=row, position=i, box=box,
                     advantage=response.advantages[i] if response.generated[i] else None,
                     segment_start=i in response.segment_starts)
