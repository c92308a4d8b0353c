"""The review page's HTML: server-rendered (Jinja2, autoescaped), judged texts as Markdown, keyboard-first (what it
shows, and its keys: docs/review.md, "The review page").

Texts come from the judged items, so they are untrusted: Markdown is rendered with raw HTML escaped and with
images and links left as the text they are (an image would make the reviewer's browser fetch a URL the text
chose), and the page's one inline script runs under a per-response nonce in a Content-Security-Policy that allows
nothing else to load. Bidi controls and invisible format characters (``VISIBLE``) are shown as markers, not applied.
"""

from __future__ import annotations

import re
from functools import cache

from optim.review.desk import CANT_JUDGE, Desk, ReviewItem
from optim.review.questions import Question
from optim.review.uncertainty import confidence_of, withheld_of

MAX_COMMENT_CHARS = 4000
# Bidi controls (ALM, LRM/RLM, embeddings and overrides, isolates) and invisible characters that hide text.
VISIBLE = {cp: f"\u27e6U+{cp:04X}\u27e7" for cp in (0x061C, 0x200B, 0x200E, 0x200F, *range(0x202A, 0x202F), 0x2060,
                                                   *range(0x2066, 0x206A), 0xFEFF)}

_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#f6f6f8;overflow-wrap:anywhere}
header{background:#23395d;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;flex-wrap:wrap;align-items:baseline}
header b{font-size:1.1em} main{padding:1em 1.2em;max-width:1500px;margin:auto}
.field{background:#fff;border:1px solid #d8d8de;border-radius:8px;padding:.4em 1em;margin-bottom:1em}
.field h2{font-size:.95em;margin:.4em 0;color:#23395d;text-transform:none}
.pair{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:1em} .pair .field{min-width:0}
pre{background:#f0f0f4;padding:.6em;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere}
code{background:#f0f0f4} table{display:block;max-width:100%;overflow-x:auto} textarea{width:100%;box-sizing:border-box}
details.guide{background:#eef3fb;border:1px solid #b8c8e4;border-radius:8px;padding:.4em 1em;margin-bottom:1em}
form.inline{display:inline;border:0;padding:0} button.quiet{background:#fff;color:#23395d;border:1px solid #23395d}
td,th{padding:.15em .7em;text-align:left;border-bottom:1px solid #ddd}
form{background:#fff;border:2px solid #23395d;border-radius:8px;padding:.6em 1em}
fieldset{border:0;margin:0 0 .6em;padding:0} legend{font-weight:600}
label{display:inline-block;margin:.2em 1em .2em 0;cursor:pointer} kbd{border:1px solid #999;border-radius:3px;
padding:0 .3em;background:#fafafa;font-size:.85em} .panel{background:#fff7e0;border:1px solid #e0c060;
border-radius:8px;padding:.5em 1em;margin-bottom:1em} .error{background:#fde;border:1px solid #c44;padding:.5em 1em}
a.button,button{background:#23395d;color:#fff;border:0;border-radius:5px;padding:.35em .9em;text-decoration:none;
font:inherit;cursor:pointer} .muted{color:#666}
"""

_SCRIPT = """
(() => {
  const form = document.getElementById('answer');
  const next = document.body.dataset.next;
  const open = () => form && [...form.querySelectorAll('fieldset')].find(
    f => !f.querySelector('input:checked') && !(f.querySelector('input[type=number]') || {}).value);
  document.addEventListener('keydown', e => {
    if (e.ctrlKey || e.metaKey || e.altKey || ['INPUT', 'TEXTAREA'].includes(e.target.tagName) &&
        e.target.type !== 'radio') return;
    const key = e.key.toLowerCase();
    if (key === 'n' && next) { e.preventDefault(); location.href = next; return; }
    const cant = document.getElementById('cant');
    if (key === 'x' && form && cant) { e.preventDefault(); form.requestSubmit(cant); return; }
    const fieldset = open();
    if (!fieldset) return;
    const choice = fieldset.querySelector(`input[data-key="${CSS.escape(key)}"]`);
    if (!choice) { const box = fieldset.querySelector('input[type=number]'); if (box) box.focus(); return; }
    e.preventDefault();
    choice.checked = true;
    if (!open()) form.requestSubmit();
  });
})();
"""

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{{ style }}</style></head>
<body data-next="{{ next_url or '' }}">
<header><b>chateval review</b><span>queue <b>{{ desk.name }}</b></span><span>reviewer <b>{{ reviewer }}</b></span>
<span>{{ progress }}</span><a href="/items" style="color:#fff">all items</a>
<span style="color:#cfd8e8">keys: the one beside each answer; x: can't judge; n: next item</span>
{% if item %}<span class="muted" style="color:#cfd8e8">item {{ item.item_id }}</span>{% endif %}
</header><main>
{% if message %}<p class="error">{{ message }}</p>{% endif %}
{% if desk.show_panel %}<p class="muted">This queue shows the panel's verdict before you answer
(it was queued with <code>--show-panel</code>).</p>{% endif %}
{{ body | safe }}
</main>{% if script %}<script nonce="{{ nonce }}">{{ script | safe }}</script>{% endif %}</body></html>
"""

_GUIDE = """<details class="guide"{% if open %} open{% endif %}><summary><b>Guidelines</b></summary>
{% if task and task.format == "pairwise" %}<p>Task <b>{{ task.name }}</b>: compare
{{ task.responses | join(" and ") }}. What to weigh:</p>
<ul>{% for c in task.criteria %}<li>{{ task.describe(c) }}</li>{% endfor %}</ul>
{% elif task %}<p>Task <b>{{ task.name }}</b>: rate {{ task.judged | join(" and ") }} on each criterion:</p><ul>
{% for c in task.criteria %}<li><b>{{ c.name }}</b> ({{ c.scale }}): {{ task.describe(c) }}</li>{% endfor %}</ul>
{% endif %}{% if guidelines %}{{ md(guidelines) | safe }}{% endif %}
<p class="muted">Can't judge it (a language you do not read, a text cut off)? Say so with <i>can't judge</i>
(<kbd>x</kbd>): it is recorded as such, never as an answer.</p></details>
"""

_ITEM = """{{ guide | safe }}
{% for name, text in item.inputs.items() %}<section class="field"><h2>{{ title(name) }}</h2>{{ md(text) | safe }}
</section>{% endfor %}
<div class="{{ 'pair' if item.judged | length == 2 else '' }}">
{% for name, text in item.judged.items() %}<section class="field judged"><h2>{{ title(name) }}
{% if item.judged | length == 2 %}<span class="muted">({{ loop.index }})</span>{% endif %}</h2>{{ md(text) | safe }}
</section>{% endfor %}</div>
{% if panel %}<section class="panel"><b>The panel's verdict:</b> {{ panel }}
{% if trace_url %} · <a href="{{ trace_url }}" target="_blank" rel="noopener">the full debate in MLflow</a>{% endif %}
</section>{% endif %}
{% if mine %}<section class="panel"><b>Your answer:</b> {{ mine }}{% if comment %} · <b>your comment:</b>
{{ comment }}{% endif %} · <a href="?edit=1">change it</a> · <form class="inline" method="post"
action="{{ action }}/withdraw"><button class="quiet" type="submit">withdraw my answer</button></form>
{% if next_url %} · <a class="button" href="{{ next_url }}">next item <kbd>n</kbd></a>{% endif %}</section>
{% else %}
<form id="answer" method="post" action="{{ action }}">
{% for q in questions %}<fieldset><legend>{{ q.instruction or q.name }}</legend>
{% for value, key, text in choices(q) %}<label>
<input type="radio" name="{{ q.name }}" value="{{ value }}" data-key="{{ key }}" required> {{ text }}
{% if key %}<kbd>{{ key }}</kbd>{% endif %}</label>{% endfor %}
{% if not q.options and not choices(q) %}<input type="number" name="{{ q.name }}" min="{{ q.low }}" max="{{ q.high }}"
step="any" required> <span class="muted">{{ q.low }} to {{ q.high }}</span>{% endif %}
</fieldset>{% endfor %}
<p><label for="comment">Comment or rationale (optional; stored with your answer)</label>
<textarea id="comment" name="comment" rows="2" maxlength="{{ max_comment }}">{{ comment }}</textarea></p>
<button type="submit">save answer</button>
<button id="cant" class="quiet" type="submit" name="cant_judge" value="1" formnovalidate>can't judge <kbd>x</kbd></button>
{% if next_url %} <a href="{{ next_url }}">skip <kbd>n</kbd></a>{% endif %}
</form>{% endif %}
"""

_ITEMS = """<section class="field"><h2>The queue's items, in the order the page walks them (most uncertain
first)</h2><table><tr><th>#</th><th>item</th><th>your answer</th></tr>
{% for n, trace_id, item_id, state in rows %}<tr><td>{{ n }}</td><td><a href="/item/{{ trace_id }}">{{ item_id }}</a>
</td><td>{{ state }}</td></tr>{% endfor %}</table></section>
"""

_OWNER = """<section class="field"><h2>Agreement among the reviewers</h2>
<p>Krippendorff's alpha per question (nominal for labels, interval for numbers): 1 is full agreement, 0 what chance
gives; it counts only items with two or more answers, and leaves "can't judge" out.</p>
<table><tr><th>question</th><th>alpha</th><th>metric</th><th>items with 2+ answers</th><th>answers in them</th>
<th>reviewers</th><th>can't judge</th></tr>
{% for a in agreement %}<tr><td>{{ a.question }}</td><td>{{ "%.3f" | format(a.alpha) if a.alpha is not none
else "undefined" }}</td><td>{{ a.metric }}</td><td>{{ a.items }}</td><td>{{ a.values }}</td><td>{{ a.reviewers }}</td>
<td>{{ a.cant_judge }}</td></tr>{% endfor %}</table></section>
<section class="field"><h2>Reviewers</h2><table><tr><th>reviewer</th><th>items answered</th><th>can't judge</th></tr>
{% for who, done, cant in reviewers %}<tr><td>{{ who }}</td><td>{{ done }} of {{ total }}</td><td>{{ cant }}</td></tr>
{% endfor %}</table></section>
<section class="field"><h2>Export</h2><p>Every answer, one per reviewer and question, with comments:
<a href="/owner/answers.jsonl">answers.jsonl</a> · <a href="/owner/answers.csv">answers.csv</a></p></section>
"""


@cache
def _markdown():
    from markdown_it import MarkdownIt

    # Images and links stay text: a judged text must not make the reviewer's browser fetch anything.
    return MarkdownIt("commonmark", {"html": False}).enable("table").disable(["image", "link", "autolink"])


def md(text: str) -> str:
    """A judged text as HTML (raw HTML escaped; see the module docstring).

    Example:
        >>> md("Steps:\\n\\n1. boil\\n2. <b>eat</b>\\n\\n![x](http://e.xample/p.png)")
        '<p>Steps:</p>\\n<ol>\\n<li>boil</li>\\n<li>&lt;b&gt;eat&lt;/b&gt;</li>\\n</ol>\\n<p>![x](http://e.xample/p.png)</p>\\n'
    """
    return _markdown().render(text)


def visible(text: str) -> str:
    """``text`` with bidi controls and invisible characters shown as markers (see the module docstring).

    Example:
        >>> visible("Open invoice\u202efdp.exe")
        'Open invoice⟦U+202E⟧fdp.exe'
    """
    return text.translate(VISIBLE)


def _finalize(value):
    """Every value the templates print, drawn as the LM read it (escaped HTML stays escaped: markers are text)."""
    from markupsafe import Markup

    if isinstance(value, Markup):
        return Markup(str(value).translate(VISIBLE))
    return visible(value) if isinstance(value, str) else value


def title(name: str) -> str:
    """A field name as a heading: ``answer_1`` -> ``Answer 1``."""
    spaced = re.sub(r"[_\s]+", " ", name).strip()
    return spaced[:1].upper() + spaced[1:]


def choices(question: Question) -> list[tuple[str, str, str]]:
    """``(value, key, text)`` per answer the keyboard can give; empty for a numeric scale typed in a box.

    Example:
        >>> choices(Question("preference", "", options=("1", "2", "tie")))
        [('1', '1', 'answer 1'), ('2', '2', 'answer 2'), ('tie', 't', 'tie')]
        >>> [k for _, k, _ in choices(Question("relevance", "", low=1, high=5))]
        ['1', '2', '3', '4', '5']
    """
    if question.options:
        if set(question.options) == {"1", "2", "tie"}:
            return [(o, "t" if o == "tie" else o, "tie" if o == "tie" else f"answer {o}") for o in question.options]
        return [(o, str(i) if i <= 9 else "", o) for i, o in enumerate(question.options, start=1)]
    low, high = question.low, question.high
    if float(low).is_integer() and float(high).is_integer() and 0 <= low and high <= 9:
        return [(str(v), str(v), str(v)) for v in range(int(low), int(high) + 1)]
    return []


def panel_text(item: ReviewItem) -> str:
    """The panel's verdict in one line, for after the reviewer answered.

    Example:
        >>> panel_text(ReviewItem("t", "q1", {}, {}, {"prediction": "2", "consistent": False,
        ...                                            "score_1": 6.5, "score_2": 7.0}))
        'answer 2 is better (scores 6.5 vs 7.0); the two answer orders disagreed'
    """
    panel = item.panel
    said = panel.get("prediction")
    if said is None and withheld_of(panel) and panel.get("withheld") is not None:  # shown after answering
        return withheld_text(panel)
    if isinstance(said, dict):
        return _verdict(said) or "the panel abstained"
    if said is None:
        return f"the panel abstained ({panel.get('abstained') or 'no verdict'})"
    text = _verdict(said) + ("" if said == "tie" else " is better")
    if panel.get("score_1") is not None and panel.get("score_2") is not None:
        text += f" (scores {panel['score_1']} vs {panel['score_2']})"
    if panel.get("consistent") is False:
        text += "; the two answer orders disagreed"
    return text


def withheld_text(panel: dict) -> str:
    """A verdict withheld for a person: that it was not given and why, then what the panel leaned to.

    Example:
        >>> withheld_text({"withheld": "2", "abstained": "needs_person", "confidence": 0.41})
        'no verdict given: it needs a person (calibrated confidence 0.41, below the threshold); the panel leaned: answer 2'
    """
    confidence = confidence_of(panel)
    why = f" (calibrated confidence {confidence:.2f}, below the threshold)" if confidence is not None else ""
    return f"no verdict given: it needs a person{why}; the panel leaned: {_verdict(panel['withheld'])}"


def _verdict(said) -> str:
    """A verdict in words: each criterion's score, a tie, or the answer chosen."""
    if isinstance(said, dict):
        return "; ".join(f"{k}: {v}" for k, v in said.items())
    return "a tie" if said == "tie" else f"answer {said}"


@cache
def _env():
    from jinja2 import DictLoader, Environment, select_autoescape

    env = Environment(loader=DictLoader({"page": _TEMPLATE, "item": _ITEM, "guide": _GUIDE, "items": _ITEMS,
                                         "owner": _OWNER}),
                      autoescape=select_autoescape(default=True, default_for_string=True), finalize=_finalize)
    env.globals.update(md=md, title=title, choices=choices, max_comment=MAX_COMMENT_CHARS)
    return env


def page(desk: Desk, reviewer: str, *, body: str, progress: str, nonce: str, item: ReviewItem | None = None,
         next_url: str | None = None, message: str | None = None, script: bool = True) -> str:
    """A whole page around ``body`` (already rendered HTML)."""
    return render(
        "page", title=f"review · {desk.name}", style=_STYLE, desk=desk, reviewer=reviewer, progress=progress, item=item,
        next_url=next_url, message=message, body=body, nonce=nonce, script=_SCRIPT if script else "")


def item_body(desk: Desk, item: ReviewItem, *, reviewer: str, action: str, next_url: str | None,
              trace_url: str | None, editing: bool = False) -> str:
    """The item: the guidelines, its fields, the judged texts (side by side for two), then the questions or the
    reviewer's answer with the panel's verdict (shown before answering only on a queue that says so)."""
    mine = None if editing else answer_text(item.answers, reviewer, desk.questions)
    answered = mine is not None
    panel = panel_text(item) if answered or desk.show_panel else None
    guide = render("guide", task=desk.guide, guidelines=desk.guidelines, open=not answered)
    return render("item", item=item, questions=desk.questions, action=action, next_url=next_url, mine=mine,
                  panel=panel, trace_url=trace_url if answered else None, guide=guide,
                  comment=item.comments.get(reviewer, ""))


def answer_text(answers: dict[str, dict[str, object]], reviewer: str, asked: list[Question]) -> str | None:
    """``reviewer``'s answer in words ("can't judge", or each question's answer), from ``{question: {reviewer:
    value}}``; None until they answered every question."""
    said = [answers.get(q.name, {}).get(reviewer) for q in asked]
    if any(v is None for v in said):
        return None
    return CANT_JUDGE if CANT_JUDGE in said else "; ".join(f"{q.name}: {v}" for q, v in zip(asked, said))


def render(template: str, **values) -> str:
    """A part of a page: ``"items"`` (``rows``: place, trace id, item id, the reviewer's answer) or ``"owner"``
    (``agreement`` per question, ``reviewers``: name, items answered, can't judge; ``total`` items)."""
    return _env().get_template(template).render(**values)
