"""The page's fixed parts: style sheet and the script that draws the charts and sorts tables.

The script reads the chart specs from a ``<script type="application/json">`` element (data,
never code), draws each with plotly.js (inlined by ``page``), and makes every
``table.sortable`` sortable by clicking a header: numbers by their raw ``data-v`` value
(largest first on the first click), text alphabetically.  Charts are drawn four
per task, so the page shows and scrolls before the last is drawn; ``window.ppReady`` is set when
every chart is drawn, for tests and for readers' scripts.
"""

CSS = """
:root { --fg:#222; --muted:#666; --line:#ddd; --bg:#fafafa; --accent:#4C78A8; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg); background:#fff; }
header { padding: 18px 28px 10px; border-bottom: 1px solid var(--line); background: var(--bg); }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: var(--muted); font-size: 12px; word-break: break-all; }
nav { position: sticky; top: 0; z-index: 5; background: #fff; border-bottom: 1px solid var(--line);
      padding: 6px 28px; font-size: 13px; white-space: nowrap; overflow-x: auto; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1500px; }
section { margin: 26px 0 10px; }
h2 { font-size: 17px; border-bottom: 2px solid var(--accent); padding-bottom: 3px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
.lead { color: var(--muted); margin: 4px 0 10px; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0 8px; }
.count { color: var(--muted); font-weight: normal; font-size: 12px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 150px; background: #fff; }
.card .v { font-size: 18px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 12px; }
.chart { width: 100%; min-height: 200px; margin: 6px 0; }
.scroll { overflow: auto; max-height: 540px; border: 1px solid var(--line); }
table { border-collapse: collapse; font-size: 12px; width: 100%; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { position: sticky; top: 0; background: var(--bg); cursor: pointer; user-select: none; white-space: nowrap; }
th.asc::after { content: " \\25B2"; } th.desc::after { content: " \\25BC"; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.txt { max-width: 640px; overflow-wrap: anywhere; }
td.loc { font-family: ui-monospace, monospace; font-size: 11px; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: 1px 14px; font-size: 12px; margin: 6px 0; }
dl.summary dt { color: var(--muted); } dl.summary dd { margin: 0; }
.badge { font-size: 11px; padding: 1px 6px; border-radius: 8px; color: #fff; }
.badge.critical { background: #c0392b; } .badge.warning { background: #d68910; } .badge.info { background: #2e86c1; }
details summary { cursor: pointer; } pre { font-size: 11px; max-height: 300px; overflow: auto; }
"""

JS = r"""
(function () {
  "use strict";
  var specs = JSON.parse(document.getElementById("pp-charts").textContent);
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"]};
  var pending = [], ids = Object.keys(specs), next = 0;
  function draw() {  // four charts per task: the page paints and scrolls while the rest are drawn
    if (next >= ids.length) {
      Promise.all(pending).then(function () { window.ppReady = true; },
                                function (e) { window.ppReady = true; throw e; });
      return;
    }
    for (var end = Math.min(next + 4, ids.length); next < end; next++) {
      var el = document.getElementById(ids[next]);
      if (el && window.Plotly) { pending.push(Plotly.newPlot(el, specs[ids[next]].data, specs[ids[next]].layout, config)); }
    }
    setTimeout(draw, 0);
  }
  function key(td) {
    if (!td) { return null; }
    var v = td.getAttribute("data-v");
    if (v !== null) { return v === "" ? null : Number(v); }
    return td.textContent;
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0], col = Number(th.getAttribute("data-col"));
    var rows = Array.prototype.slice.call(body.rows);
    var numeric = rows.some(function (r) { return r.cells[col] && r.cells[col].hasAttribute("data-v"); });
    var dir = th.classList.contains("desc") ? "asc" : th.classList.contains("asc") ? "desc" : (numeric ? "desc" : "asc");
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.classList.remove("asc", "desc"); });
    th.classList.add(dir);
    var sign = dir === "asc" ? 1 : -1;
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      if (x === null || y === null) { return (x === null) - (y === null); }
      if (typeof x === "number" && typeof y === "number") { return sign * (x - y); }
      return sign * String(x).localeCompare(String(y));
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
  });
  draw();
})();
"""
