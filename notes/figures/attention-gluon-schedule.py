"""Draws docs/assets/images/attention-gluon-schedule.svg: one program of the Gluon attention forward
(kernels/attention_gluon.py) in its steady state, time running down the page.

A schematic, not a measurement: the durations below are chosen to show the order of events and which work
can overlap, not read from a trace. Run `python docs/assets/images/attention-gluon-schedule.py` to redraw.

Columns: the loader warp; for each consumer warpgroup, what its wgmmas keep the tensor cores doing and what
its threads do meanwhile. Consumer c's iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to
back, waits for S_j, runs the softmax of tile j while P_{j-1} V_{j-1} is still in flight, then rescales O by
alpha. Consumer 1 is drawn half a period behind consumer 0, so its products fall inside consumer 0's
softmax; the lab's plan does not enforce that offset (no ping-pong), it only allows it.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

# Schematic durations (arbitrary units, 1 unit = 1 drawn unit of height).
QK, PV = 36, 36  # the two wgmmas of one iteration
SOFTMAX, RESCALE = 86, 22  # exponentials and row sums of one tile; O *= alpha and P to registers
PERIOD = QK + SOFTMAX + RESCALE  # one consumer's iteration: its next issue waits for the rescale
OFFSET = QK + PV  # consumer 1 behind consumer 0
COPY = 30  # one TMA copy in flight
FREE_AT = OFFSET + QK + SOFTMAX - PERIOD  # after an iteration's start, when V_{j-2}'s slot is freed (both)
WINDOW = 468  # the time drawn
FIRST = 2  # consumer 0's first iteration drawn

WIDTH = 440
TOP = 108  # y of time 0
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
COLUMNS = {  # name: (x, width)
    "loader": (30, 66),
    "mma0": (104, 70),
    "soft0": (178, 84),
    "mma1": (272, 70),
    "soft1": (346, 84),
}
KINDS = {  # css class: legend text
    "copy": "TMA copy of a K or V tile",
    "wait": "waiting (mbarrier or wgmma)",
    "qk": "S = QKᵀ on the tensor cores",
    "pv": "O += PV on the tensor cores",
    "soft": "softmax of one tile",
    "scale": "rescale O by α",
}
STYLE = """
.panel { fill: #ffffff; stroke: #ced4da; }
.ink { fill: #212529; }
.muted { fill: #495057; }
.axis { stroke: #495057; }
.band { fill: #fff3bf; }
.copy { fill: #d0bfff; } .qk { fill: #a5d8ff; } .pv { fill: #b2f2bb; }
.soft { fill: #ffd8a8; } .scale { fill: #dee2e6; } .wait { fill: url(#hatch); } .waitbase { fill: #f8f9fa; }
.box { stroke: #495057; stroke-width: 1; }
.label { fill: #212529; }
.hatchline { stroke: #ced4da; }
@media (prefers-color-scheme: dark) {
  .panel { fill: #1e2128; stroke: #495057; }
  .ink { fill: #e9ecef; } .muted { fill: #ced4da; } .axis { stroke: #ced4da; }
  .band { fill: #5c4a12; } .hatchline { stroke: #495057; } .waitbase { fill: #2b2f38; }
}
"""


def block(out: list, column: str, kind: str, start: float, end: float, text: str = "") -> None:
    """A box in `column` from time `start` to `end`, cut to the window; `text` on it where it fits."""
    start, end = max(start, 0), min(end, WINDOW)
    if end - start <= 0:
        return
    x, w = COLUMNS[column]
    y, h = TOP + start, end - start
    if kind == "wait":  # hatching over a plain ground, its words in the panel's ink (light or dark)
        out.append(f'<rect class="waitbase" x="{x}" y="{y}" width="{w}" height="{h}" rx="3"/>')
    out.append(f'<rect class="{kind} box" x="{x}" y="{y}" width="{w}" height="{h}" rx="3"/>')
    ink = "ink" if kind == "wait" else "label"
    lines = text.split("\n") if text else []
    if lines and h >= 20 * len(lines):
        first = y + h / 2 - 9 * (len(lines) - 1) + 5.5
        for i, line in enumerate(lines):
            out.append(f'<text class="{ink}" x="{x + w / 2}" y="{first + 18 * i:.1f}" text-anchor="middle" '
                       f'font-size="15">{escape(line)}</text>')


def consumer(out: list, c: int) -> None:
    mma, soft = f"mma{c}", f"soft{c}"
    for j in range(FIRST - 2, FIRST + 4):
        s = (j - FIRST) * PERIOD + c * OFFSET
        block(out, mma, "qk", s, s + QK, f"QKᵀ {j}")
        block(out, mma, "pv", s + QK, s + QK + PV, f"PV {j - 1}")
        block(out, soft, "wait", s, s + QK, "wait S")
        block(out, soft, "soft", s + QK, s + QK + SOFTMAX, f"softmax {j}")
        block(out, soft, "scale", s + QK + SOFTMAX, s + PERIOD, "×α")


def loader(out: list) -> None:
    # V_n's slot is freed when both consumers are done with V_{n-2}; K_{n+1} follows at once (its slot was
    # freed long before), then the loader waits on the next V-free barrier.
    for n in range(FIRST - 2, FIRST + 4):
        s = (n - FIRST) * PERIOD + FREE_AT
        block(out, "loader", "copy", s, s + COPY, f"V {n}")
        block(out, "loader", "copy", s + COPY, s + 2 * COPY, f"K {n + 1}")
        block(out, "loader", "wait", s + 2 * COPY, s + PERIOD, "wait\nV free")


def text(out: list, x: float, y: float, words: str, size: int = 15, cls: str = "ink", anchor: str = "middle",
         weight: str = "400") -> None:
    out.append(f'<text class="{cls}" x="{x}" y="{y}" text-anchor="{anchor}" font-size="{size}" '
               f'font-weight="{weight}">{escape(words)}</text>')


def legend(out: list, y0: float) -> float:
    items = list(KINDS.items())
    for i, (kind, words) in enumerate(items):
        y = y0 + 26 * i
        if kind == "wait":
            out.append(f'<rect class="waitbase" x="30" y="{y}" width="26" height="18" rx="3"/>')
        out.append(f'<rect class="{kind} box" x="30" y="{y}" width="26" height="18" rx="3"/>')
        text(out, 66, y + 14, words, anchor="start")
    y = y0 + 26 * len(items)
    out.append(f'<rect class="band" x="30" y="{y}" width="26" height="18" rx="3"/>')
    text(out, 66, y + 14, "consumer 1 multiplies while", anchor="start")
    text(out, 66, y + 33, "consumer 0 runs its softmax", anchor="start")
    return y + 48


def draw() -> str:
    body: list[str] = []
    # the highlighted stretch: consumer 0's softmax of its second drawn tile, beside consumer 1's products
    start = PERIOD + QK
    x0, x1 = COLUMNS["soft0"][0] - 3, COLUMNS["mma1"][0] + COLUMNS["mma1"][1] + 3
    body.append(f'<rect class="band" x="{x0}" y="{TOP + start}" width="{x1 - x0}" height="{SOFTMAX}"/>')
    loader(body)
    consumer(body, 0)
    consumer(body, 1)
    head: list[str] = []
    text(head, WIDTH / 2, 28, "One program of the Gluon forward", size=17, weight="700")
    text(head, WIDTH / 2, 48, "schematic: order of events, not measured times", cls="muted")
    lx, lw = COLUMNS["loader"]
    text(head, lx + lw / 2, 76, "Loader", size=16, weight="700")
    text(head, lx + lw / 2, 96, "1 warp", cls="muted")
    for c in (0, 1):
        mx, mw = COLUMNS[f"mma{c}"]
        sx, sw = COLUMNS[f"soft{c}"]
        text(head, (mx + sx + sw) / 2, 76, f"Consumer {c}", size=16, weight="700")
        text(head, mx + mw / 2, 96, "wgmma", cls="muted")
        text(head, sx + sw / 2, 96, "threads", cls="muted")
    axis = [f'<line class="axis" x1="14" y1="{TOP}" x2="14" y2="{TOP + WINDOW - 8}" stroke-width="2" '
            f'marker-end="url(#arrow)"/>',
            f'<text class="muted" x="0" y="0" font-size="15" text-anchor="middle" '
            f'transform="translate(10 {TOP + WINDOW / 2}) rotate(-90)">time</text>']
    foot: list[str] = []
    bottom = legend(foot, TOP + WINDOW + 22)
    height = bottom + 10
    defs = ('<defs><pattern id="hatch" width="8" height="8" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><line class="hatchline" x1="0" y1="0" x2="0" y2="8" stroke-width="3"/>'
            '</pattern><marker id="arrow" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="6" markerHeight="6" '
            'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#868e96"/></marker></defs>')
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" width="{WIDTH}" '
        f'height="{height:.0f}" font-family="{FONT}" role="img" aria-label="Schematic timeline of one program '
        f'of the Gluon attention forward: a loader warp and two consumer warpgroups">',
        f"<style>{STYLE}</style>", defs,
        f'<rect class="panel" x="0.5" y="0.5" width="{WIDTH - 1}" height="{height - 1:.0f}" rx="10"/>',
        *head, *axis, *body, *foot, "</svg>", ""])


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[2] / "docs" / "assets" / "images" / "attention-gluon-schedule.svg"
    out.write_text(draw(), encoding="utf-8")
    print(out)
