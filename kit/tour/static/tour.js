// kit tour: draws what the server sends. Every number and every lesson's text comes from /api (kit functions);
// this script only lays them out, streams the playground and draws the charts.
"use strict";
const $ = (id) => document.getElementById(id);
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];
let LESSONS = [], DEFAULTS = {}, current = 0, visited = new Set(), job = null, abort = null, timer = null;

async function api(path, body) {
  const opt = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const r = await fetch(path, opt);
  let data;
  try { data = await r.json(); } catch (e) { throw new Error(`HTTP ${r.status}: ${r.statusText}`); }
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}

function showError(msg) { const e = $("error"); e.hidden = !msg; e.textContent = msg || ""; }

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// ------------------------------------------------------------------------------------------ navigation
function renderNav() {
  const nav = $("nav"); nav.innerHTML = "";
  LESSONS.forEach((l, i) => {
    const b = el("button", {"data-lesson": l.id}, `${i + 1}. ${l.title}`);
    if (i === current) b.classList.add("current"); else if (visited.has(i)) b.classList.add("done");
    b.onclick = () => go(i);
    nav.appendChild(b);
  });
  $("progress").textContent = `Lesson ${current + 1} of ${LESSONS.length}`;
  $("prev").disabled = current === 0;
  $("next").disabled = current === LESSONS.length - 1;
}

function go(i) {
  visited.add(current);
  current = Math.max(0, Math.min(LESSONS.length - 1, i));
  const l = LESSONS[current];
  document.body.dataset.lesson = l.id;
  $("lesson-title").textContent = l.title;
  $("lesson-text").textContent = l.text;
  $("lesson-expect").textContent = l.expect;
  showError("");
  $("playground").hidden = l.id !== "playground";
  $("generic").hidden = l.id === "playground";
  if (l.id === "playground") setupPlayground(l); else setupGeneric(l);
  renderNav();
}

// ------------------------------------------------------------------------------------------ playground
function control(l, name) { return l.controls.find((c) => c.name === name); }

function setupPlayground(l) {
  if ($("pg-prompt").dataset.ready) return;
  $("pg-prompt").dataset.ready = "1";
  $("pg-prompt").value = control(l, "prompt").default;
  const pick = $("pg-pick"); pick.innerHTML = "";
  pick.appendChild(el("option", {value: ""}, "(type your own)"));
  for (const p of control(l, "pick").options) pick.appendChild(el("option", {value: p}, p.length > 70 ? p.slice(0, 70) + "…" : p));
  pick.onchange = () => { if (pick.value) $("pg-prompt").value = pick.value; };
  const src = $("pg-source"); src.innerHTML = "";
  const labels = {"in-process": "in-process model", url: "endpoint URL", sim: "the kit's simulated server", launch: "a server the kit launches"};
  for (const s of control(l, "source").options) src.appendChild(el("option", {value: s}, labels[s] || s));
  src.value = DEFAULTS.url ? "url" : "in-process";
  const dl = $("pg-models");
  for (const m of control(l, "model").options) dl.appendChild(el("option", {value: m}));
  $("pg-model").value = DEFAULTS.model || control(l, "model").default;
  $("pg-url").value = DEFAULTS.url || "";
  $("pg-served").value = DEFAULTS.served_model || "";
  if (DEFAULTS.stall_range) { $("pg-stall").min = DEFAULTS.stall_range[0]; $("pg-stall").max = DEFAULTS.stall_range[1]; }
  if (DEFAULTS.stall_s) $("pg-stall").value = DEFAULTS.stall_s;
  $("pg-max").value = control(l, "max_tokens").default;
  src.onchange = sourceFields; sourceFields();
  $("pg-send").onclick = send;
  $("pg-stop").onclick = stop;
}

function sourceFields() {
  const s = $("pg-source").value;
  $("pg-url-label").hidden = s !== "url";
  $("pg-served-label").hidden = s !== "url";
  $("pg-model-label").hidden = !(s === "in-process" || s === "launch");
  $("pg-server-label").hidden = s !== "launch";
  // a launched server takes a local checkpoint directory, never a preset name (empty: the kit's tiny checkpoint)
  const m = $("pg-model"), presets = [...$("pg-models").options].map((o) => o.value);
  if (s === "launch" && presets.includes(m.value)) m.value = "";
  if (s === "in-process" && !m.value) m.value = DEFAULTS.model || "";
  m.placeholder = s === "launch" ? "(empty: the kit's tiny checkpoint)" : "";
}

let itl = [];
function resetLive() {
  $("pg-tokens").innerHTML = ""; $("pg-summary").textContent = "";
  for (const id of ["pg-ttft", "pg-itl", "pg-toks"]) $(id).textContent = "–";
  $("pg-n").textContent = "0"; itl = []; drawStrip();
}

function fmt(v, unit, d = 1) { return v === null || v === undefined ? "–" : `${Number(v).toFixed(d)} ${unit}`; }

function onEvent(ev) {
  if (ev.type === "job") job = ev.id;
  else if (ev.type === "note" || ev.type === "start") $("pg-status").textContent = ev.message || (ev.model ? `streaming from ${ev.url} (${ev.model})` : `prompt: ${ev.prompt_tokens} tokens`);
  else if (ev.type === "token") {
    $("pg-tokens").appendChild(el("span", {class: "tok"}, ev.text));
    $("pg-tokens").scrollTop = 1e9;
    $("pg-ttft").textContent = fmt(ev.ttft_ms, "ms");
    $("pg-itl").textContent = fmt(ev.itl_ms, "ms", 2);
    $("pg-toks").textContent = fmt(ev.tok_s, "tok/s");
    $("pg-n").textContent = String(ev.n);
    if (ev.itl_ms !== null) { for (let i = 0; i < (ev.k || 1); i++) itl.push(ev.itl_ms); drawStrip(); }
  } else if (ev.type === "summary") $("pg-summary").textContent = ev.line;
  else if (ev.type === "stopped") $("pg-status").textContent = ev.message || `stopped after ${ev.tokens} token${ev.tokens === 1 ? "" : "s"}`;
  else if (ev.type === "error") { showError(ev.message); $("pg-status").textContent = "failed"; }
}

async function send() {
  showError(""); resetLive();
  const source = $("pg-source").value;  // an endpoint's model is the served model (empty: the first it lists)
  const body = {prompt: $("pg-prompt").value, source, model: source === "url" ? $("pg-served").value : $("pg-model").value,
    url: $("pg-url").value, server: $("pg-server").value, max_tokens: Number($("pg-max").value), stall_s: Number($("pg-stall").value)};
  $("pg-send").disabled = true; $("pg-stop").disabled = false; $("pg-status").textContent = "sending…"; stopping = false;
  abort = new AbortController();
  try {
    const r = await fetch("/api/generate", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body), signal: abort.signal});
    if (!r.ok) {  // a refused request: the server's one-line reason
      const text = await r.text();
      let why = text;
      try { why = JSON.parse(text).error || text; } catch (e) { /* not JSON: as sent */ }
      throw new Error(why);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i); buf = buf.slice(i + 2);
        for (const line of block.split("\n")) if (line.startsWith("data: ")) onEvent(JSON.parse(line.slice(6)));
      }
    }
    const st = $("pg-status").textContent;
    if (stopping && !st.startsWith("stopped")) $("pg-status").textContent = "stopped";
    else if (st.startsWith("streaming") || st.startsWith("prompt")) $("pg-status").textContent = "done";
  } catch (e) {
    if (e.name !== "AbortError") { showError(String(e.message || e)); $("pg-status").textContent = "failed"; }
    else if (!$("pg-status").textContent.startsWith("stopped")) $("pg-status").textContent = "stopped";
  } finally {
    stopping = false;
    $("pg-send").disabled = false; $("pg-stop").disabled = true; job = null; abort = null;
  }
}

let stopping = false;
async function stop() {
  const id = job, mine = abort; // this stream's: a later Send has its own
  stopping = true; $("pg-status").textContent = "stopping…";
  if (id !== null) { try { await api("/api/stop", {id}); } catch (e) { /* the stream may be gone already */ } }
  setTimeout(() => { if (mine && abort === mine) mine.abort(); }, 1500); // it ends by itself after Stop; if not, close it
}

let stripFrame = null;
function drawStrip() {  // at most one redraw per animation frame: a fast server sends hundreds of tokens a second
  const svg = $("itl-chart");
  svg.setAttribute("data-points", String(itl.length));
  if (stripFrame !== null) return;
  stripFrame = requestAnimationFrame(() => {
    stripFrame = null;
    drawChart(svg, {kind: "line", x: "token", y: "ms", int_x: true, series: [{name: "ITL", points: itl.map((v, i) => [i + 2, v]), dots: itl.length <= 300}]}, true);
  });
}

// ------------------------------------------------------------------------------------------ other lessons
function setupGeneric(l) {
  const box = $("controls"); box.innerHTML = "";
  for (const c of l.controls) {
    const lab = el("label", {}, c.label + " ");
    let inp;
    if (c.kind === "select") {
      inp = el("select");
      for (const o of c.options) inp.appendChild(el("option", {value: o}, String(o)));
      inp.value = String(c.default);
    } else if (c.kind === "slider") {
      inp = el("input", {type: "range"});
      const out = el("output", {}, String(c.default));
      if (c.log) {
        // steps double; the last one is the control's max itself (e.g. 16376: the model's limit, not 16384)
        inp.min = Math.log2(c.min); inp.max = Math.ceil(Math.log2(c.max)); inp.step = 1; inp.value = Math.log2(c.default);
        inp.dataset.log = "1"; inp.dataset.max = c.max;
      } else { inp.min = c.min; inp.max = c.max; inp.step = c.step; inp.value = c.default; }
      inp.oninput = () => { out.textContent = String(sliderValue(inp)); };
      lab.appendChild(inp); lab.appendChild(out);
    } else {
      inp = el("input", {type: c.kind === "number" ? "number" : "text"});
      inp.value = c.default;
    }
    inp.dataset.name = c.name; inp.classList.add("ctl");
    if (c.kind !== "slider") lab.appendChild(inp);
    inp.addEventListener("change", () => { clearTimeout(timer); timer = setTimeout(runLesson, 250); });
    box.appendChild(lab);
  }
  $("run").onclick = runLesson;
  for (const id of ["result-line", "numbers", "table", "assumptions"]) $(id).innerHTML = "";
  for (const id of ["chart", "chart2"]) $(id).innerHTML = "";
  shown($("chart2"), false);
  runLesson();
}

function shown(e, on) { e.style.display = on ? "" : "none"; } // an <svg> has no .hidden property

function sliderValue(inp) { return inp.dataset.log ? Math.min(2 ** Number(inp.value), Number(inp.dataset.max)) : Number(inp.value); }

let runSeq = 0;
async function runLesson() {
  const l = LESSONS[current], settings = {}, seq = ++runSeq;
  for (const inp of document.querySelectorAll("#controls .ctl")) {
    const c = control(l, inp.dataset.name);
    settings[c.name] = c.kind === "slider" ? sliderValue(inp) : (c.kind === "number" || typeof c.default === "number") ? Number(inp.value) : inp.value;
  }
  $("run-status").textContent = "measuring…"; showError("");
  try {
    const res = await api(`/api/lesson/${l.id}`, settings);
    if (seq !== runSeq || LESSONS[current].id !== l.id) return;
    showResult(res);
    $("run-status").textContent = res.ok ? "done" : "problems: " + res.problems.join("; ");
  } catch (e) {
    if (seq !== runSeq) return;
    showError(String(e.message || e)); $("run-status").textContent = "failed";
  }
}

function showResult(res) {
  $("result-line").textContent = res.line;
  const dl = $("numbers"); dl.innerHTML = "";
  for (const [k, v] of Object.entries(res.numbers || {})) {
    dl.appendChild(el("dt", {}, k));
    const dd = el("dd", {}, String(v));
    if (/^(pass|fail|error|skipped)$/.test(v)) dd.className = v;
    dl.appendChild(dd);
  }
  shown($("chart"), !!res.chart); shown($("chart2"), !!res.fronts);
  if (res.chart) drawChart($("chart"), res.chart);
  if (res.fronts) drawChart($("chart2"), res.fronts);
  const t = $("table"); t.innerHTML = "";
  if (res.table) {
    const tab = el("table"), head = el("tr");
    for (const c of res.table.columns) head.appendChild(el("th", {}, c));
    tab.appendChild(head);
    for (const r of res.table.rows) {
      const tr = el("tr");
      for (const v of r) tr.appendChild(el("td", {}, typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : v === null ? "n/a" : String(v)));
      tab.appendChild(tr);
    }
    t.appendChild(tab);
  }
  $("assumptions").textContent = res.assumptions ? "assumptions: " + res.assumptions : "";
}

// ------------------------------------------------------------------------------------------ charts (SVG)
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// round ticks: the smallest step of 1, 2 or 5 × 10^k that cuts lo..hi into at most n + 1 parts (whole steps when
// asked: counts, token numbers), from the last step at or below lo to the first at or above hi (an axis ends on one)
function ticks(lo, hi, n = 5, integer = false) {
  const span = hi - lo || 1, p = 10 ** Math.floor(Math.log10(span / (n + 1)));
  let step = [1, 2, 5, 10, 20].map((f) => f * p).find((s) => span / s <= n + 1);
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.floor(lo / step + 1e-9) * step; v < hi + step - 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
// a tick label: 2000 → "2k", 1024 → "1,024", 0.25 → "0.25" (never exponents)
function short(v) {
  const a = Math.abs(v);
  if (a >= 1e6 && v % 1e5 === 0) return `${v / 1e6}M`;
  if (a >= 1e3 && v % 1e3 === 0) return `${v / 1e3}k`;
  if (a >= 1e3) return Math.round(v).toLocaleString("en-US");
  if (a >= 10 || Number.isInteger(v)) return String(Math.round(v));
  return String(Number(v.toPrecision(2)));
}

function drawChart(svg, spec, compact) {
  svg.innerHTML = "";
  const W = Number(svg.getAttribute("width")), H = Number(svg.getAttribute("height"));
  const m = {l: 52, r: 24, t: compact ? 8 : 24, b: 36};
  if (spec.kind === "bars" || spec.kind === "stacked") return drawBars(svg, spec, W, H, m);
  const pts = spec.series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[0] !== null));
  if (!pts.length) { svg.appendChild(svgEl("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#999"}, "no points yet")); return; }
  const fx = spec.log_x ? Math.log2 : (v) => v;
  let x0 = Math.min(...pts.map((p) => fx(p[0]))), x1 = Math.max(...pts.map((p) => fx(p[0])));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  const yt = ticks(0, Math.max(...pts.map((p) => p[1])) * 1.05 || 1, 5, spec.int_y);
  const y1 = yt[yt.length - 1], y0 = 0;
  const X = (v) => m.l + (fx(v) - x0) / (x1 - x0) * (W - m.l - m.r), Y = (v) => H - m.b - (v - y0) / (y1 - y0) * (H - m.t - m.b);
  svg.appendChild(svgEl("line", {x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b, stroke: "#333"}));
  svg.appendChild(svgEl("line", {x1: m.l, y1: m.t, x2: m.l, y2: H - m.b, stroke: "#333"}));
  for (const v of yt) {
    svg.appendChild(svgEl("text", {x: m.l - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 10}, short(v)));
    svg.appendChild(svgEl("line", {x1: m.l, y1: Y(v), x2: W - m.r, y2: Y(v), stroke: "#eee"}));
  }
  const xs = [...new Set(pts.map((p) => p[0]))].sort((a, b) => a - b);
  const xt = xs.length <= 8 ? xs : (spec.log_x ? ticks(x0, x1, 6, true) : ticks(x0, x1, 6, spec.int_x)).filter((t) => t >= x0 && t <= x1).map((t) => spec.log_x ? 2 ** t : t);
  for (const v of xt) svg.appendChild(svgEl("text", {x: X(v), y: H - m.b + 14, "text-anchor": "middle", "font-size": 10}, short(v)));
  svg.appendChild(svgEl("text", {x: (W + m.l) / 2, y: H - 4, "text-anchor": "middle", "font-size": 11}, spec.x));
  svg.appendChild(svgEl("text", {x: 10, y: (H - m.b + m.t) / 2, "font-size": 11, transform: `rotate(-90 12 ${(H - m.b + m.t) / 2})`, "text-anchor": "middle"}, spec.y));
  spec.series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length], p = s.points.filter((q) => q[1] !== null);
    svg.appendChild(svgEl("polyline", {points: p.map((q) => `${X(q[0])},${Y(q[1])}`).join(" "), fill: "none", stroke: c, "stroke-width": 2, "stroke-dasharray": s.dash ? "6 4" : "", class: "series"}));
    if (s.dots || (s.dots === undefined && p.length < 30)) for (const q of p) svg.appendChild(svgEl("circle", {cx: X(q[0]), cy: Y(q[1]), r: 2.5, fill: c, class: "pt"}));
    if (!compact) svg.appendChild(svgEl("text", {x: m.l + 8 + (i % 3) * 170, y: 14 + Math.floor(i / 3) * 12, fill: c, "font-size": 11}, "— " + s.name));
  });
  for (const mk of spec.marks || []) {
    svg.appendChild(svgEl("line", {x1: X(mk.x), x2: X(mk.x), y1: m.t, y2: H - m.b, stroke: "#888", "stroke-dasharray": "3 3", class: "mark"}));
    svg.appendChild(svgEl("text", {x: X(mk.x) + 4, y: m.t + 24, "font-size": 11, fill: "#555"}, mk.label));
  }
}

function drawBars(svg, spec, W, H, m) {
  const bars = spec.bars, stacked = spec.kind === "stacked";
  const total = (b) => stacked ? Object.values(b.parts).reduce((a, v) => a + (v || 0), 0) : (b.value || 0);
  const yt = ticks(0, Math.max(spec.limit || 0, ...bars.map(total)) * 1.08 || 1);
  const y1 = yt[yt.length - 1];
  const Y = (v) => H - m.b - v / y1 * (H - m.t - m.b), bw = Math.min(60, (W - m.l - m.r) / bars.length * 0.7);
  svg.appendChild(svgEl("line", {x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b, stroke: "#333"}));
  for (const v of yt) svg.appendChild(svgEl("text", {x: m.l - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 10}, short(v)));
  svg.appendChild(svgEl("text", {x: 4, y: 12, "font-size": 11}, spec.y));  // above the ticks, not over them
  bars.forEach((b, i) => {
    const x = m.l + (i + 0.5) * (W - m.l - m.r) / bars.length - bw / 2;
    if (stacked) {
      let acc = 0;
      Object.entries(b.parts).forEach(([k, v], j) => {
        svg.appendChild(svgEl("rect", {x, y: Y(acc + v), width: bw, height: Math.max(0, Y(acc) - Y(acc + v)), fill: COLORS[j], class: "bar"}));
        if (v > y1 * 0.04) svg.appendChild(svgEl("text", {x: x + bw + 6, y: (Y(acc) + Y(acc + v)) / 2 + 4, "font-size": 11}, `${k} ${v.toFixed(1)}`));
        acc += v;
      });
    } else if (b.value !== null) {
      svg.appendChild(svgEl("rect", {x, y: Y(b.value), width: bw, height: Y(0) - Y(b.value), fill: COLORS[0], class: "bar"}));
      svg.appendChild(svgEl("text", {x: x + bw / 2, y: Y(b.value) - 3, "font-size": 10, "text-anchor": "middle"}, short(b.value)));
    }
    svg.appendChild(svgEl("text", {x: x + bw / 2, y: H - m.b + 14, "font-size": 10, "text-anchor": "middle"}, b.label));
  });
  if (spec.limit) {
    svg.appendChild(svgEl("line", {x1: m.l, x2: W - m.r, y1: Y(spec.limit), y2: Y(spec.limit), stroke: "#d62728", "stroke-dasharray": "5 3"}));
    svg.appendChild(svgEl("text", {x: W - m.r - 4, y: Y(spec.limit) - 4, "font-size": 10, "text-anchor": "end", fill: "#d62728"}, `memory ${spec.limit} GB`));
  }
}

// ------------------------------------------------------------------------------------------ start
$("prev").onclick = () => go(current - 1);
$("next").onclick = () => go(current + 1);
api("/api/lessons").then((d) => { LESSONS = d.lessons; DEFAULTS = d.defaults; go(0); }).catch((e) => showError(String(e.message || e)));
