"""The report's page: its HTML skeleton, style and script, with the data embedded as JSON.

The script draws what the reader chooses: the timeline of a window of steps and the answers of a step coloured
by a quantity; the curves are already SVG (:mod:`grpo_rl.run.report.charts`), the script only adds their hover
read-out. ``?part=curves|timeline|answers|events`` shows one part alone; ``&run=``, ``&from=``, ``&to=``,
``&step=`` and ``&color=`` preset the choices (links and screenshots).
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

STYLE = """
body{font:13px/1.45 system-ui,sans-serif;margin:0 18px 40px;color:#222;background:#fff}
h1{font-size:19px;margin:14px 0 2px}h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
nav a{margin-right:14px}.sub{color:#666}
.panels{display:flex;flex-wrap:wrap;gap:10px}.panel{border:1px solid #e3e3e3;padding:4px 6px;position:relative}
.panel h3{font-size:12px;margin:0 0 2px;font-weight:600}
.chart .plot{fill:#fcfcfc;stroke:#ccc}.chart .grid{stroke:#eee}.chart .tick{font-size:9px;fill:#666}
.chart .line{fill:none;stroke-width:1.6}.chart .eval{stroke:#9c27b0;stroke-opacity:.35;stroke-dasharray:3 3}
.chart .cursor{stroke:#555;stroke-width:.8}
.legend{font-size:10.5px;max-width:380px}.legend span{margin-right:8px;white-space:nowrap}
.legend svg{vertical-align:middle;margin-right:2px}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:11px;padding:4px 6px;border-radius:3px;
 white-space:pre;display:none;z-index:9}
.controls{margin:6px 0 8px}.controls label{margin-right:14px}input[type=number]{width:64px}
.group{border:1px solid #e3e3e3;margin:0 0 12px;padding:6px 8px}.question{font-weight:600;white-space:pre-wrap}
.answer{margin:6px 0 0;border-top:1px dashed #e3e3e3;padding-top:4px}.head{font-size:12px;color:#444}
.tokens{font:12px/1.7 ui-monospace,monospace;white-space:pre-wrap;word-break:break-word}
.tok{border-radius:2px}.tok:hover{outline:1px solid #000}
.turn{border-left:3px solid #1f77b4;padding-left:6px;margin:3px 0}.turn.tool{border-color:#999;background:#f3f3f3}
.turn .who{font:10px system-ui;color:#777;display:block}
.scale{display:inline-block;width:160px;height:10px;vertical-align:middle;margin:0 6px;border:1px solid #ccc}
table.events td{padding:2px 8px;vertical-align:top;border-bottom:1px solid #eee}.kind{font-weight:600}
pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:11.5px;max-height:420px}.absent{color:#888}
"""

SCRIPT = r"""
const D = JSON.parse(document.getElementById('report-data').textContent);
const Q = new URLSearchParams(location.search);
const $ = (s, el) => (el || document).querySelector(s);
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function sv(tag, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
if (Q.get('part')) document.querySelectorAll('section').forEach(s => { s.hidden = s.id !== Q.get('part'); });
function fill(select, options, chosen) {
  select.innerHTML = '';
  for (const [value, label] of options) select.appendChild(el('option', {value}, label));
  if (chosen !== null && options.some(([v]) => String(v) === String(chosen))) select.value = chosen;
}
for (const id of ['tl-run', 'an-run']) {
  fill($('#' + id), D.runs.map((r, i) => [i, r.label]), Q.get('run'));
  $('#' + id).parentElement.hidden = D.runs.length < 2;
}
function fmt(v) {
  if (typeof v !== 'number') return v;
  return Math.abs(v) >= 1e4 || (v && Math.abs(v) < 1e-3) ? v.toExponential(2) : +v.toPrecision(4);
}

// Curves: the hover read-out of the nearest step of every series.
const tip = $('#tip');
function nearest(xs, x) {
  let lo = 0, hi = xs.length - 1;
  while (lo < hi) { const m = (lo + hi) >> 1; if (xs[m] < x) lo = m + 1; else hi = m; }
  return lo > 0 && x - xs[lo - 1] < xs[lo] - x ? lo - 1 : lo;
}
document.querySelectorAll('.panel').forEach(div => {
  const p = D.panels[+div.dataset.panel], svg = $('svg', div), cursor = $('.cursor', svg), C = D.chart;
  const wide = Math.max(1, D.x[1] - D.x[0]);
  svg.addEventListener('mousemove', ev => {
    const r = svg.getBoundingClientRect(), px = (ev.clientX - r.left) * C.width / r.width;
    const step = D.x[0] + (px - C.left) / C.pw * wide;
    const lines = p.series.map(s => {
      const i = nearest(s.steps, step), who = D.runs.length > 1 ? D.runs[s.run].label + ': ' : '';
      return who + s.key + ' = ' + fmt(s.values[i]) + '  (step ' + s.steps[i] + ')';
    });
    const x = C.left + (Math.round(step) - D.x[0]) / wide * C.pw;
    cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
    tip.textContent = lines.join('\n'); tip.style.display = 'block';
    tip.style.left = (ev.clientX + 14) + 'px'; tip.style.top = (ev.clientY + 10) + 'px';
  });
  svg.addEventListener('mouseleave', () => {
    tip.style.display = 'none';
    cursor.setAttribute('visibility', 'hidden');
  });
});

// Timeline: one lane per process and track, the spans of a window of steps.
const SPAN_COLORS = {'wait for batch': '#c7c7c7', 'generate': '#1f77b4', 'reward': '#2ca02c', 'reference': '#9467bd',
  'advantages': '#bcbd22', 'train': '#d62728', 'push': '#ff7f0e', 'wait for push': '#ffbb78', 'evaluate': '#8c564b',
  'checkpoint': '#e377c2', 'load weights': '#17becf'};
const OTHER = ['#aec7e8', '#98df8a', '#c5b0d5', '#c49c94', '#f7b6d2', '#dbdb8d', '#9edae5', '#7f7f7f'];
const spanColor = (name, i) => SPAN_COLORS[name] || (name.startsWith('restart') ? '#000' : OTHER[i % OTHER.length]);
function timelineSetup() {
  const T = D.runs[+$('#tl-run').value].timeline, steps = T.steps.map(s => s[0]);
  const first = steps.length ? steps[0] : 0, last = steps.length ? steps[steps.length - 1] : 0;
  for (const id of ['#tl-from', '#tl-to']) { $(id).min = first; $(id).max = last; }
  const from = Math.max(first, Math.min(2, last));  // step 1 warms up: start at 2 where there is one
  $('#tl-from').value = Q.get('from') || from; $('#tl-to').value = Q.get('to') || Math.min(last, from + 3);
  drawTimeline();
}
function drawTimeline() {
  const T = D.runs[+$('#tl-run').value].timeline, box = $('#tl-box');
  box.innerHTML = '';
  if (!T.spans.length) {
    box.appendChild(el('p', {class: 'absent'}, 'No trace: this run has no trace.json (logger.trace=false?).'));
    return;
  }
  const a = +$('#tl-from').value, b = +$('#tl-to').value, starts = new Map(T.steps);
  const t0 = starts.has(a) ? starts.get(a) : 0, after = T.steps.find(s => s[0] > b);
  const t1 = after ? after[1] : Math.max(...T.spans.map(s => s[2] + s[3]));
  const shown = T.spans.filter(s => s[2] < t1 && s[2] + s[3] > t0);
  const W = Math.max(700, box.clientWidth - 10), L = 190, H = 22, lanes = T.lanes.length;
  const svg = sv('svg', {width: W, height: lanes * H + 30, class: 'timeline'}), span = Math.max(1e-9, t1 - t0);
  const X = t => L + Math.max(0, Math.min(1, (t - t0) / span)) * (W - L - 8);
  T.lanes.forEach((name, i) => {
    svg.appendChild(sv('rect', {x: 0, y: i * H, width: W, height: H, fill: i % 2 ? '#fafafa' : '#fff'}));
    svg.appendChild(sv('text', {x: 4, y: i * H + 15, 'font-size': 11}, name));
  });
  for (const [s, t] of T.steps) if (t >= t0 && t < t1) {
    svg.appendChild(sv('line', {x1: X(t), x2: X(t), y1: 0, y2: lanes * H, stroke: '#888', 'stroke-dasharray': '2 3'}));
    svg.appendChild(sv('text', {x: X(t) + 2, y: lanes * H + 12, 'font-size': 10, fill: '#555'}, 'step ' + s));
  }
  for (const [lane, n, start, dur, step] of shown) {
    const name = T.names[n], x = X(start), w = Math.max(1, X(start + dur) - x);
    const r = sv('rect', {x, y: lane * H + 3, width: w, height: H - 6, fill: spanColor(name, n), rx: 2});
    const when = (step >= 0 ? ' (step ' + step + ')' : '') + ': ' + fmt(dur) + ' ms, at ' + fmt(start / 1000) + ' s';
    r.appendChild(sv('title', {}, name + when));
    svg.appendChild(r);
    if (w > 46) {
      const label = {x: x + 3, y: lane * H + 15, 'font-size': 10, fill: '#fff', 'pointer-events': 'none'};
      svg.appendChild(sv('text', label, name));
    }
  }
  const caption = 'window: ' + fmt((t1 - t0) / 1000) + ' s from ' + fmt(t0 / 1000) + ' s';
  svg.appendChild(sv('text', {x: L, y: lanes * H + 26, 'font-size': 10, fill: '#555'}, caption));
  box.appendChild(svg);
  const key = el('div', {class: 'legend'});
  for (const n of new Set(shown.map(s => s[1]))) {
    const entry = el('span'), colour = spanColor(T.names[n], n);
    const swatch = 'display:inline-block;width:10px;height:10px;margin-right:3px;background:' + colour;
    entry.appendChild(el('span', {style: swatch}));
    entry.appendChild(document.createTextNode(T.names[n]));
    key.appendChild(entry);
  }
  box.appendChild(key);
}
$('#tl-run').addEventListener('change', timelineSetup);
$('#tl-from').addEventListener('change', drawTimeline);
$('#tl-to').addEventListener('change', drawTimeline);
timelineSetup();

// Answers: each token coloured by the chosen quantity, its values on hover.
const gap = a => i => a.learner_logprob[i] - a.logprob[i];
const QUANTITIES = {  // name, and for an answer: the token's value, or nothing where the answer lacks the data
  gap: ['learner − engine log-prob', a => a.learner_logprob && gap(a)],
  weight: ['importance weight π_old/μ', a => a.learner_logprob && (i => Math.exp(gap(a)(i)))],
  outside: ['outside the engine correction bounds', a => a.engine_outside && (i => +a.engine_outside.includes(i))],
  version: ['policy version', a => (a.version || a.policy_version !== undefined)
    && (i => (a.version ? a.version[i] : a.policy_version))],
  logprob: ['engine log-prob', a => a.logprob && (i => a.logprob[i])],
  none: ['nothing', a => null],
};
const rgba = (rgb, t) => 'rgba(' + rgb + ',' + Math.max(0, Math.min(1, t)).toFixed(2) + ')';
const RED = '214,39,40', BLUE = '31,119,180';
function colour(q, v, top) {
  if (v === undefined || v === null || Number.isNaN(v)) return '';
  if (q === 'gap') return v >= 0 ? rgba(RED, v / 0.5) : rgba(BLUE, -v / 0.5);
  if (q === 'weight') { const l = Math.log2(v); return l >= 0 ? rgba(RED, l) : rgba(BLUE, -l); }
  if (q === 'outside') return v ? rgba(RED, 0.75) : '';
  if (q === 'version') return top - v <= 0 ? '' : rgba('255,127,14', 0.25 + 0.25 * (top - v));
  if (q === 'logprob') return rgba('255,140,0', -v / 8);
  return '';
}
const DIVERGING = 'linear-gradient(90deg,rgb(' + BLUE + '),#fff,rgb(' + RED + '))';
const SCALES = {gap: [DIVERGING, '−0.5 … 0 … +0.5'], weight: [DIVERGING, '½ … 1 … 2'],
  logprob: ['linear-gradient(90deg,rgb(255,140,0),#fff)', '−8 … 0'],
  outside: ['linear-gradient(90deg,#fff 50%,' + rgba(RED, 0.75) + ' 50%)', 'inside … outside (truncated or masked)'],
  version: ['linear-gradient(90deg,#fff,rgb(255,127,14))', 'newest … 3 behind']};
function answersSetup() {
  const S = D.runs[+$('#an-run').value].samples, steps = Object.keys(S).map(Number).sort((a, b) => a - b);
  const detailed = steps.filter(s => S[s].some(r => r.answers));
  const options = steps.map(s => [s, 'step ' + s + (S[s].some(r => r.answers) ? '' : ' (text only)')]);
  fill($('#an-step'), options, Q.get('step') || (detailed.length ? detailed.pop() : steps.pop()));
  drawAnswers();
}
function drawAnswers() {
  const S = D.runs[+$('#an-run').value].samples, box = $('#an-box');
  box.innerHTML = '';
  const rows = S[$('#an-step').value] || [], answers = rows.flatMap(r => r.answers || []);
  const versions = answers.flatMap(a => a.version || (a.policy_version !== undefined ? [a.policy_version] : []));
  const varies = new Set(versions).size > 1, top = Math.max(...versions);
  const choices = Object.keys(QUANTITIES).filter(q => q === 'none'
    || (answers.some(a => QUANTITIES[q][1](a)) && (q !== 'version' || varies)));
  const chosen = $('#an-color').value || Q.get('color') || choices[0];
  fill($('#an-color'), choices.map(q => [q, QUANTITIES[q][0]]), chosen);
  const q = $('#an-color').value, scale = SCALES[q];
  $('#an-scale').hidden = !scale;
  if (scale) $('#an-scale').style.background = scale[0];
  $('#an-scale-text').textContent = scale ? scale[1] : '';
  const noLearner = answers.length && !answers.some(a => a.learner_logprob);
  $('#an-missing').textContent = noLearner ? 'The learner\'s log-probs were not recorded for this step (a data-'
    + 'parallel learner group keeps them in its ranks): only the engine\'s are shown.' : '';
  if (!rows.length) box.appendChild(el('p', {class: 'absent'}, 'No samples logged at this step.'));
  for (const row of rows) {
    const g = el('div', {class: 'group'}), more = el('details');
    g.appendChild(el('div', {class: 'question'}, row.question));
    const reference = row.reference !== undefined ? ' · reference: ' + JSON.stringify(row.reference) : '';
    more.appendChild(el('summary', {}, 'full prompt' + reference));
    more.appendChild(el('pre', {}, row.prompt));
    g.appendChild(more);
    (row.answers || [row]).forEach((a, k) => g.appendChild(answerBlock(a, k, q, top)));
    box.appendChild(g);
  }
}
function answerHead(a, k) {
  const parts = Object.keys(a).filter(x => x.startsWith('reward_')).map(x => x.slice(7) + ' ' + fmt(a[x]));
  let head = 'answer ' + (k + 1) + ' · reward ' + fmt(a.reward) + (parts.length ? ' (' + parts.join(', ') + ')' : '');
  if (a.advantage !== undefined) head += ' · advantage ' + (a.advantage >= 0 ? '+' : '') + a.advantage.toFixed(3);
  if (a.truncated) head += ' · truncated';
  if (a.tokens) head += ' · ' + a.tokens.length + ' tokens';
  return el('div', {class: 'head'}, head);
}
function tokenInfo(a, i, text, isTool) {
  const info = [JSON.stringify(text), 'engine log-prob ' + fmt(a.logprob[i])];
  if (a.learner_logprob) {
    const g = a.learner_logprob[i] - a.logprob[i];
    info.push('learner log-prob ' + fmt(a.learner_logprob[i]), 'gap ' + fmt(g), 'weight ' + fmt(Math.exp(g)));
  }
  if (a.engine_outside && a.engine_outside.includes(i)) info.push('outside the engine correction bounds');
  if (a.version) info.push('version ' + a.version[i]);
  else if (a.policy_version !== undefined) info.push('version ' + a.policy_version);
  if (isTool) info.push('tool / template token (not trained on)');
  return info.join('\n');
}
function answerBlock(a, k, q, top) {
  const div = el('div', {class: 'answer'}), body = el('div', {class: 'tokens'});
  div.appendChild(answerHead(a, k));
  div.appendChild(body);
  if (!a.tokens) { body.textContent = a.response; return div; }
  const value = QUANTITIES[q][1](a), context = new Set();
  for (const [s, e] of a.context || []) for (let i = s; i < e; i++) context.add(i);
  let turn = null, tool = null;
  a.tokens.forEach((text, i) => {
    const isTool = context.has(i);
    if (a.context && (turn === null || isTool !== tool)) {  // a new turn: the model's, or a tool's reply
      turn = el('div', {class: 'turn' + (isTool ? ' tool' : '')});
      turn.appendChild(el('span', {class: 'who'}, isTool ? 'tool reply / template' : 'model'));
      body.appendChild(turn);
      tool = isTool;
    }
    const t = el('span', {class: 'tok', title: tokenInfo(a, i, text, isTool)}, text.replace(/\n/g, '↵\n'));
    const bg = colour(q, value && !isTool ? value(i) : null, top);
    if (bg) t.style.background = bg;
    (turn || body).appendChild(t);
  });
  return div;
}
$('#an-run').addEventListener('change', answersSetup);
$('#an-step').addEventListener('change', drawAnswers);
$('#an-color').addEventListener('change', drawAnswers);
answersSetup();
document.body.dataset.ready = '1';
"""


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def embed(data: dict[str, Any]) -> str:
    """``data`` as JSON safe inside a ``<script>`` element."""
    text = json.dumps(_finite(data), separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render(title: str, subtitle: str, panels_html: str, events_html: str, data: dict[str, Any]) -> str:
    """The whole page."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1><div class="sub">{html.escape(subtitle)}</div>
<nav><a href="#curves">curves</a><a href="#timeline">timeline</a><a href="#answers">answers</a>
<a href="#events">events</a></nav>
<section id="curves"><h2>Curves</h2>
<div class="sub">Purple dashes: steps where the run evaluated. Hover a chart for its values.</div>
<div class="panels">{panels_html}</div></section>
<section id="timeline"><h2>Timeline</h2>
<div class="controls"><label>run <select id="tl-run"></select></label>
<label>steps <input id="tl-from" type="number"> to <input id="tl-to" type="number"></label>
<span class="sub">one lane per process and track; hover a span for its step and duration</span></div>
<div id="tl-box"></div></section>
<section id="answers"><h2>Answers, token by token</h2>
<div class="controls"><label>run <select id="an-run"></select></label><label><select id="an-step"></select></label>
<label>colour by <select id="an-color"></select></label><span id="an-scale" class="scale"></span>
<span id="an-scale-text" class="sub"></span></div><div id="an-missing" class="sub"></div>
<div id="an-box"></div></section>
<section id="events"><h2>Events</h2>{events_html}</section>
<div id="tip"></div>
<script type="application/json" id="report-data">{embed(data)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
