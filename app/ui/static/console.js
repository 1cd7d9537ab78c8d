// The console's own script: sortable, filterable overview rows (kept across live updates) and
// the small uPlot charts drawn from each row's data-chart. No inline script anywhere: the
// pages' Content-Security-Policy allows scripts from /ui/static only.
(function () {
  "use strict";
  var sort = { col: null, dir: 1, kind: "text" };

  function cellValue(row, col) {
    var cell = row.children[col];
    return cell ? cell.getAttribute("data-value") || cell.textContent : "";
  }

  function applySort(tbody) {
    if (sort.col === null) return;
    var rows = Array.prototype.slice.call(tbody.querySelectorAll("tr[data-key]"));
    rows.sort(function (a, b) {
      var x = cellValue(a, sort.col), y = cellValue(b, sort.col);
      if (sort.kind === "num") return (parseFloat(x) - parseFloat(y)) * sort.dir;
      return x.localeCompare(y) * sort.dir;
    });
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  function applyFilter(tbody) {
    var input = document.getElementById("filter");
    if (!input) return;
    var needle = input.value.trim().toLowerCase();
    tbody.querySelectorAll("tr[data-key]").forEach(function (r) {
      r.hidden = needle !== "" && r.getAttribute("data-key").toLowerCase().indexOf(needle) < 0;
    });
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function drawCharts(root) {
    if (typeof uPlot === "undefined") return;
    root.querySelectorAll(".spark[data-chart]").forEach(function (el) {
      var data;
      try { data = JSON.parse(el.getAttribute("data-chart")); } catch (e) { return; }
      if (!data.length || data[0].length < 2) return;
      el.textContent = "";
      var line = cssVar("--accent"), area = cssVar("--muted");
      new uPlot({
        width: el.clientWidth || 140, height: el.clientHeight || 36,
        legend: { show: false }, cursor: { show: false }, select: { show: false },
        axes: [{ show: false }, { show: false }, { show: false, scale: "depth" }],
        scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } },
                  depth: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
        series: [{}, { stroke: line, width: 1.5 },
                 { stroke: area, fill: area + "33", width: 1, scale: "depth" }]
      }, data, el);
    });
  }

  function refresh() {
    var tbody = document.getElementById("consumers");
    if (!tbody) return;
    applySort(tbody);
    applyFilter(tbody);
    drawCharts(tbody);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("thead button[data-sort]").forEach(function (button) {
      button.addEventListener("click", function () {
        var col = parseInt(button.getAttribute("data-col"), 10);
        sort.dir = sort.col === col ? -sort.dir : 1;
        sort.col = col;
        sort.kind = button.getAttribute("data-sort");
        document.querySelectorAll("thead th").forEach(function (th) { th.removeAttribute("aria-sort"); });
        button.parentElement.setAttribute("aria-sort", sort.dir > 0 ? "ascending" : "descending");
        refresh();
      });
    });
    var input = document.getElementById("filter");
    if (input) input.addEventListener("input", refresh);
    refresh();
  });
  document.body && document.body.addEventListener("htmx:afterSettle", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
})();
