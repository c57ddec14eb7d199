"""The page of ``ppo-lm report`` (docs/report.md): one self-contained HTML file — the records as JSON, the
images as data URIs, the colouring and the hover card in a few lines of JavaScript; nothing is fetched."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

QUANTITIES: list[tuple[str, str]] = [
    ("advantage", "Â (advantage the update used)"),
    ("advantage_raw", "Â as the estimator returned it"),  # completed per run by raw_advantage_label
    ("delta", "δ (TD residual)"),
    ("value", "V_old(x_t)"),
    ("kl", "KL (per token, to the reference)"),
    ("ratio", "ratio π_θ/π_old after the update (colour: ratio − 1)"),
    ("reward", "r_t (shaped reward)"),
    ("return", "R̂_t (critic target)"),
]
"""The colouring choices, in the select's order: (record key, label)."""


def raw_advantage_label(records: list[dict]) -> str:
    """The select's label of ``advantage_raw`` for one iteration's ``records``: what the run's estimator
    returned (the records' ``advantage_raw_is``) and whether the trainer whitened it into Â — "before
    whitening" alone would be wrong for REINFORCE++ (it whitens inside the estimator) and GRPO/RLOO
    (group-normalised or centred scores, which the trainer does not whiten). Files written before
    the records carried it get the plain label."""
    base = dict(QUANTITIES)["advantage_raw"]
    first = records[0] if records else {}
    what = first.get("advantage_raw_is")
    if not isinstance(what, str) or not what:
        return base
    after = "; the trainer whitened it into Â" if first.get("whitened") else "; the update used it as is (= Â)"
    return f"{base}: {what}{after}"


def record_turns(record: dict) -> list[dict]:
    """A credit record's turns as ``[{"start", "end", "reward"}, …]`` (its sampled tokens are
    ``tokens[start:end]``; docs/report.md): the record's own ``turns`` where it has them; else, as in a
    file written before records carried them, one turn per run of ``action`` tokens with a null reward
    (two turns with no observation between them are then one run, and count as one); [] for a
    single-turn record (neither key)."""
    n = len(record.get("tokens") or [])
    turns = record.get("turns")

    def valid(t) -> bool:
        return (isinstance(t, dict) and all(isinstance(t.get(k), int) for k in ("start", "end"))
                and 0 <= t["start"] < t["end"] <= n)

    if isinstance(turns, list) and turns and all(map(valid, turns)):
        return [{"start": t["start"], "end": t["end"], "reward": t.get("reward")} for t in turns]
    action = record.get("action")
    if not isinstance(action, list):
        return []
    out: list[dict] = []
    for i, a in enumerate(action):
        if a and out and out[-1]["end"] == i:  # the run goes on
            out[-1]["end"] = i + 1
        elif a:
            out.append({"start": i, "end": i + 1, "reward": None})
    return out


SYMBOLS = {"logp_old": "log π_old", "logp_ref": "log π_ref", "kl": "KL", "reward": "r", "value": "V", "delta": "δ",
           "advantage_raw": "Â raw", "advantage": "Â", "return": "R̂", "ratio": "ratio"}
"""How the hover card names each per-token value."""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.controls { margin: .8em 0; } .note { color: #666; font-size: .9em; }
.episode { margin: .7em 0; padding: .4em .6em; border-left: 3px solid #ccc; }
.episode .head { color: #555; font-size: .85em; } .episode .prompt { color: #888; white-space: pre-wrap; }
.tokens { font-family: ui-monospace, monospace; font-size: 16px; line-height: 1.9; }
.tok { white-space: pre; padding: 1px 0; border-right: 1px solid #fff; cursor: default; }
.tok:hover { outline: 1px solid #000; }
.tok.obs { color: #777; font-style: italic; }  /* an environment's tokens: context, no loss */
.tok.turn { border-left: 2px solid #333; margin-left: 2px; }  /* the first token of a later turn */
#legend { display: inline-flex; align-items: center; gap: .4em; margin-left: 1em; font-size: .85em; }
#legend .bar { width: 160px; height: 12px; background: linear-gradient(to right, rgb(33,102,172), #fff, rgb(178,24,43)); }
#tip { position: fixed; display: none; background: #fffff8; border: 1px solid #999; padding: .4em .6em;
       font-size: 12px; box-shadow: 2px 2px 6px rgba(0,0,0,.2); pointer-events: none; z-index: 10; }
#tip table { border-collapse: collapse; } #tip th { text-align: left; padding-right: 1em; font-weight: normal; color: #555; }
#tip td { font-family: ui-monospace, monospace; text-align: right; }
img { max-width: 100%; }
"""

_SCRIPT = """
"use strict";
const DATA = JSON.parse(document.getElementById("credit-data").textContent);
const KEYS = DATA.keys, SYMBOLS = DATA.symbols;
const fmt = x => (x === null || x === undefined) ? "—" : Number(x.toPrecision(4)).toString();
const shown = q => (x => (x === null ? null : (q === "ratio" ? x - 1 : x)));
function colour(x, scale) {
  if (x === null) return "rgb(221, 221, 221)";
  const s = Math.min(Math.abs(x) / scale, 1);
  const [r, g, b] = x >= 0 ? [178, 24, 43] : [33, 102, 172];  // diverging: blue < 0 < red, white at 0
  const mix = (c) => Math.round(255 + (c - 255) * s);
  return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
}
function tokenText(t, id) {
  if (t === "") return `⟨${id}⟩`;
  return t.replace(/\\n/g, "↵").replace(/\\t/g, "→");
}
function ending(ep, before, after) {  // the bootstrap value only where a critic gave one
  if (ep.terminated) return "terminated";
  return ep.bootstrap_value === null ? "truncated" : `truncated${before}${fmt(ep.bootstrap_value)}${after}`;
}
const tip = document.getElementById("tip");
function showTip(ev) {
  const el = ev.currentTarget, ep = DATA.episodes[+el.dataset.e], t = +el.dataset.t;
  const rows = KEYS.map(k => `<tr><th>${SYMBOLS[k]}</th><td data-key="${k}">${fmt(ep[k] ? ep[k][t] : null)}</td></tr>`);
  const end = ending(ep, ", bootstrap V ", "");
  const turns = DATA.turns[+el.dataset.e], k = turns.findIndex(u => t >= u.start && t < u.end);
  const obs = ep.action && !ep.action[t] ? " · observation (context: no loss, KL or value)"
    : k >= 0 ? ` · turn ${k + 1}/${turns.length}` : "";
  tip.innerHTML = `<div><b></b> · token ${t + 1}/${ep.tokens.length} · id ${ep.token_ids[t]}${obs}</div>` +
    `<table>${rows.join("")}</table><div>score ${fmt(ep.score)} · ${end}</div>`;
  tip.querySelector("b").textContent = JSON.stringify(ep.tokens[t]);
  tip.style.display = "block";
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
  tip.style.left = Math.max(x, 0) + "px"; tip.style.top = Math.max(y, 0) + "px";
}
function hideTip() { tip.style.display = "none"; }
function render() {
  const root = document.getElementById("episodes");
  DATA.episodes.forEach((ep, e) => {
    const div = document.createElement("div"); div.className = "episode";
    const head = document.createElement("div"); head.className = "head";
    const end = ending(ep, " (bootstrap V ", ")");
    const lam = ep.lam === null ? "" : ` · λ ${fmt(ep.lam)}`;
    // turns from the record (DATA.turns: its `turns`, or runs of action tokens in older files)
    const turns = DATA.turns[e], n = turns.length;
    const obs = ep.action && ep.action.some(a => !a) ? " (observations in grey italics)" : "";
    const rewards = turns.some(u => u.reward !== null)
      ? ` · turn rewards ${turns.map(u => fmt(u.reward)).join(", ")}` : "";
    head.textContent = `episode ${ep.episode} · score ${fmt(ep.score)} · ${end} · ${ep.tokens.length} tokens` +
      (n ? ` · ${n} turn${n === 1 ? "" : "s"}${obs}${rewards}` : "") +
      ` · ${ep.estimator}, γ ${fmt(ep.gamma)}${lam}, β ${fmt(ep.kl_coef)} (${ep.kl_estimator})`;
    const prompt = document.createElement("div"); prompt.className = "prompt"; prompt.textContent = ep.prompt;
    const toks = document.createElement("div"); toks.className = "tokens";
    const starts = new Set(turns.slice(1).map(u => u.start));  // a bar before each later turn, adjacent too
    ep.tokens.forEach((t, i) => {
      const s = document.createElement("span"); s.className = "tok";
      s.dataset.e = e; s.dataset.t = i; s.textContent = tokenText(t, ep.token_ids[i]);
      if (ep.action && !ep.action[i]) s.classList.add("obs");
      else if (starts.has(i)) s.classList.add("turn");
      s.addEventListener("mouseenter", showTip); s.addEventListener("mousemove", showTip);
      s.addEventListener("mouseleave", hideTip);
      toks.appendChild(s);
    });
    div.append(head, prompt, toks); root.appendChild(div);
  });
}
function recolour() {
  const q = document.getElementById("quantity").value, f = shown(q);
  let scale = 0;
  for (const ep of DATA.episodes) for (const x of (ep[q] || [])) if (x !== null) scale = Math.max(scale, Math.abs(f(x)));
  scale = scale || 1;
  document.querySelectorAll(".tok").forEach(s => {
    const ep = DATA.episodes[+s.dataset.e], v = ep[q] ? ep[q][+s.dataset.t] : null;
    s.style.backgroundColor = colour(f(v), scale);
  });
  document.getElementById("lo").textContent = fmt(-scale) + (q === "ratio" ? " (ratio − 1)" : "");
  document.getElementById("hi").textContent = fmt(scale);
}
render();
recolour();
document.getElementById("quantity").addEventListener("change", recolour);
"""


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def _json_for_script(obj) -> str:
    """JSON that cannot end its <script> element early (a token may well be ``</script>``)."""
    return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(run_name: str, iteration: int, iterations: list[int], records: list[dict],
                images: list[tuple[str, Path]], notes: list[str], keys: tuple[str, ...]) -> str:
    """The HTML of the report: ``records`` (one iteration's credit records) as rows of tokens, then
    ``images`` (caption, PNG) inlined. ``keys``: the per-token values the hover card lists."""
    data = {"episodes": records, "turns": [record_turns(r) for r in records], "keys": list(keys),
            "symbols": SYMBOLS}
    labels = {**dict(QUANTITIES), "advantage_raw": raw_advantage_label(records)}
    options = "".join(f'<option value="{k}">{html.escape(labels[k])}</option>' for k, _ in QUANTITIES)
    others = ", ".join(str(i) for i in iterations)
    figures = "".join(f'<h2>{html.escape(cap)}</h2><img alt="{html.escape(cap)}" src="{data_uri(p)}">'
                      for cap, p in images)
    notes_html = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<link rel="icon" href="data:,">
<title>ppo-lm report · {html.escape(run_name)} · iteration {iteration}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{html.escape(run_name)} · token-level credit, iteration {iteration}</h1>
<p class="note">Iterations with sampled episodes: {html.escape(others)} (<code>ppo-lm report RUN_DIR --iteration N</code>
shows another). Hover a token for every value of it; colours are centred at 0 (blue &lt; 0 &lt; red) and scaled
to the largest magnitude on this page; grey = no value (no critic).</p>
<div class="controls"><label>colour by <select id="quantity">{options}</select></label>
<span id="legend"><span id="lo"></span><span class="bar"></span><span id="hi"></span></span></div>
<div id="episodes"></div>
<div id="tip"></div>
{figures}
{notes_html}
<script type="application/json" id="credit-data">{_json_for_script(data)}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
