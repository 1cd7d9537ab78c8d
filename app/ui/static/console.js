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

  // The charts' colours come from the stylesheet's --chart-* variables, which differ between
  // the light and the dark scheme; a canvas keeps what it was drawn with, so every chart is
  // drawn again when the scheme changes (see the matchMedia listener below).
  function palette() {
    return { axis: cssVar("--chart-axis"), grid: cssVar("--chart-grid"),
             line: cssVar("--chart-line"), area: cssVar("--chart-area") };
  }

  // No point markers: uPlot fills them white, a bright dot in the dark scheme.
  var NONE = { show: false };

  function zeroBased(u, min, max) { return [0, Math.max(1, max)]; }
  // Headroom over the depth, so that a steady queue's area does not fill the whole plot.
  function depthRange(u, min, max) { return [0, Math.max(1, max) * 1.25]; }

  // The data is [time, rate, depth]; the depth's area is drawn first, so that the rate's line
  // lies over it rather than under its tint.
  function layered(data) { return [data[0], data[2], data[1]]; }

  function sparkOptions(el, c) {
    return {
      width: el.clientWidth || 140, height: el.clientHeight || 36,
      legend: { show: false }, cursor: { show: false }, select: { show: false },
      axes: [{ show: false }, { show: false }, { show: false, scale: "depth" }],
      scales: { x: { time: true }, y: { range: zeroBased }, depth: { range: depthRange } },
      series: [{}, { stroke: c.area, fill: c.area + "33", width: 1, scale: "depth", points: NONE },
               { stroke: c.line, width: 1.5, points: NONE }]
    };
  }

  function axis(c, extra) {
    var a = { stroke: c.axis, font: "12px system-ui, sans-serif",
              grid: { stroke: c.grid, width: 1 }, ticks: { stroke: c.axis, width: 1 } };
    for (var k in extra) a[k] = extra[k];
    return a;
  }

  function fullOptions(el, c) {
    return {
      width: el.clientWidth || 600, height: 200,
      legend: { show: false }, cursor: { show: false }, select: { show: false },
      axes: [axis(c, {}), axis(c, { size: 44 }),
             axis(c, { scale: "depth", side: 1, size: 44, grid: { show: false } })],
      scales: { x: { time: true }, y: { range: zeroBased }, depth: { range: depthRange } },
      series: [{}, { stroke: c.area, fill: c.area + "33", width: 1, scale: "depth", points: NONE },
               { stroke: c.line, width: 2, points: NONE }]
    };
  }

  function draw(el, options) {
    if (typeof uPlot === "undefined") return;
    var data;
    try { data = JSON.parse(el.getAttribute("data-chart")); } catch (e) { return; }
    if (!data.length || data[0].length < 2) return;
    el.textContent = "";
    new uPlot(options(el, palette()), layered(data), el);
  }

  function drawCharts(root) {
    root.querySelectorAll(".spark[data-chart]").forEach(function (el) { draw(el, sparkOptions); });
    root.querySelectorAll(".chart[data-chart]").forEach(function (el) { draw(el, fullOptions); });
  }

  // A live update replaces the table's rows (and a sort moves them), which drops the keyboard's
  // focus to the page's start; it is put back on the same link of the same consumer instead.
  var focusAt = null;
  document.addEventListener("focusin", function (e) {
    var row = e.target.closest ? e.target.closest("#consumers tr[data-key]") : null;
    focusAt = row ? { key: row.getAttribute("data-key"), href: e.target.getAttribute("href") } : null;
  });

  function keepFocus(tbody) {
    var now = document.activeElement;
    if (!focusAt || (now && now !== document.body && now.isConnected)) return;
    var rows = tbody.querySelectorAll("tr[data-key]");
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute("data-key") !== focusAt.key) continue;
      var links = rows[i].querySelectorAll("a[href]"), target = links[0];
      for (var j = 0; j < links.length; j++) {
        if (links[j].getAttribute("href") === focusAt.href) target = links[j];
      }
      if (target) target.focus({ preventScroll: true });
      return;
    }
  }

  function refresh() {
    var tbody = document.getElementById("consumers");
    if (!tbody) return;
    applySort(tbody);
    applyFilter(tbody);
    drawCharts(tbody);
    keepFocus(tbody);
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
    refresh();  // the overview's rows and their charts
    document.querySelectorAll(".chart[data-chart]").forEach(function (el) { draw(el, fullOptions); });
    if (window.matchMedia) {
      window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () {
        drawCharts(document);
      });
    }
  });
  document.body && document.body.addEventListener("htmx:afterSettle", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
})();
