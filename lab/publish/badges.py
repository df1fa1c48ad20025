"""Verdict badges and point words: one small HTML component, the same on every page and in every snippet.

A badge is `<span class="kl-badge kl-badge--<state>">Word</span>`; its colour and icon come from
docs/assets/stylesheets/extra.css, one per state, so colour is never the only signal (the word is there,
and the icon differs too). A point's word (Faster, Level, ...) is the lighter `kl-word` mark. Every text
that goes into the HTML passes through `esc` (lab.publish.escape.attribute), so a record's strings can never
become markup; what these functions return is Markdown of the project's own (an Md), which the templates
take as it is.
"""

from __future__ import annotations

from lab.evidence.verdict import (
    FAILED,
    FASTER,
    INCONCLUSIVE,
    LEVEL,
    NO_EVIDENCE,
    OPEN,
    REJECTED,
    SLOWER,
    STALE,
    SUPPORTED,
    UNDECIDED,
    Verdict,
)
from lab.publish.escape import Md, attribute

# What each word means, in the words every page uses (the legend, tooltips, the method page).
MEANING = {
    SUPPORTED: "every point meets the claim",
    REJECTED: "some point is Slower or Failed",
    INCONCLUSIVE: "neither: some point is Undecided, or short of a win claim",
    STALE: "code hashed into the newest run has changed since; the old data is kept, marked",
    NO_EVIDENCE: "no GPU run yet",
    OPEN: "a decision whose experiments are neither all Supported nor any Rejected",
    FASTER: "the whole 95% interval lies above 1 + margin",
    LEVEL: "the whole 95% interval lies within 1/(1 + margin) – 1 + margin: a tie",
    SLOWER: "the whole 95% interval lies below 1/(1 + margin)",
    UNDECIDED: "the interval crosses an edge of the tie band: neither inside the band nor clear of it",
    FAILED: "the subject was incorrect, errored, unsupported or unavailable",
}
VERDICT_STATES = (SUPPORTED, REJECTED, INCONCLUSIVE, STALE, NO_EVIDENCE, OPEN)
POINT_WORDS = (FASTER, LEVEL, SLOWER, UNDECIDED, FAILED)


def esc(text: object) -> str:
    """`text` safe inside HTML (and inert as Markdown: pipes, backticks and brackets escaped, lines joined)."""
    return attribute(text)


def css_name(word: str) -> str:
    return word.lower().replace(" ", "-")


def badge(state: str, title: str = "", label: str | None = None) -> Md:
    """The badge of a verdict or decision state; `title` is its tooltip (e.g. the verdict's summary)."""
    tip = f' title="{esc(title)}"' if title else ""
    return Md(f'<span class="kl-badge kl-badge--{css_name(state)}"{tip}>{esc(label or state)}</span>')


def word(point_word: str, title: str = "") -> Md:
    """The mark of a point's word (Faster, Level, Slower, Undecided, Failed)."""
    tip = f' title="{esc(title)}"' if title else ""
    return Md(f'<span class="kl-word kl-word--{css_name(point_word)}"{tip}>{esc(point_word)}</span>')


def tick(state: str, link: str | None, title: str) -> Md:
    """One run in a history strip: a small square in its verdict's colour, linked to its record. Written as a
    Markdown link so that MkDocs resolves `link` like every other link on the page. Without a link (a run
    whose record the repository holds and the site does not: lab.publish.served) the same square, unlinked."""
    if link is None:
        return Md(f'<span class="kl-tick kl-tick--{css_name(state)}" title="{esc(title)}">'
                  f'<span class="kl-sr">{esc(state)}</span></span>')
    tip = esc(title).replace("&quot;", "").replace("&#x27;", "")
    return Md(f'[<span class="kl-sr">{esc(state)}</span>]({link} "{tip}"){{ .kl-tick .kl-tick--{css_name(state)} }}')


def verdict_badge(verdict: Verdict | None) -> Md:
    """A verdict's badge; a stale one also says, in small print, what its old data said."""
    if verdict is None:
        return badge(NO_EVIDENCE, MEANING[NO_EVIDENCE])
    out = badge(verdict.state, verdict.summary)
    if verdict.state == STALE and verdict.data_state:
        out += Md(f' <span class="kl-was">was {badge(verdict.data_state, "what that run said under the rule")}</span>')
    return out


def legend_rows() -> dict[str, list[dict]]:
    """Every badge and word with its meaning: the legend snippet, and the page the browser tests read."""
    return {
        "states": [{"badge": badge(s), "meaning": MEANING[s]} for s in VERDICT_STATES],
        "words": [{"badge": word(w), "meaning": MEANING[w]} for w in POINT_WORDS],
    }
