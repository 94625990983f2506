/* kumiko_jobs: a small SVG line chart, no dependencies, no build step.
 *
 * KumikoCharts.line(element, {labels: [...], series: [{name, values: [number|null]}]})
 * draws one chart into element (replacing what it held). Series differ by dash pattern and
 * marker shape as well as colour, so they read without colour; colours come from CSS
 * custom properties (dashboard.css), which follow the admin's light and dark themes.
 * The drawn numbers are kept on the element (dataset.points, JSON) for tests and tools.
 */
"use strict";
(function () {
  var NS = "http://www.w3.org/2000/svg";
  var DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 5", "10 4"];
  var MARKERS = ["circle", "square", "triangle", "diamond", "cross", "bar"];
  var W = 560, H = 200, L = 48, R = 8, T = 8, B = 24;

  function el(name, attrs) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }

  function nice(max) {
    if (max <= 0) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(max)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= max) return steps[i] * p;
    return 10 * p;
  }

  function marker(kind, x, y, cls) {
    var s = 3;
    if (kind === "circle") return el("circle", {cx: x, cy: y, r: s, "class": cls});
    if (kind === "square") return el("rect", {x: x - s, y: y - s, width: 2 * s, height: 2 * s, "class": cls});
    var d = {
      triangle: "M" + x + " " + (y - s) + "L" + (x + s) + " " + (y + s) + "L" + (x - s) + " " + (y + s) + "Z",
      diamond: "M" + x + " " + (y - s) + "L" + (x + s) + " " + y + "L" + x + " " + (y + s) + "L" + (x - s) + " " + y + "Z",
      cross: "M" + (x - s) + " " + (y - s) + "L" + (x + s) + " " + (y + s) + "M" + (x + s) + " " + (y - s) + "L" + (x - s) + " " + (y + s),
      bar: "M" + (x - s) + " " + y + "L" + (x + s) + " " + y
    }[kind];
    return el("path", {d: d, "class": cls + " kj-open"});
  }

  function line(target, spec) {
    var labels = spec.labels, series = spec.series, n = labels.length;
    var max = 0;
    series.forEach(function (s) { s.values.forEach(function (v) { if (v != null && v > max) max = v; }); });
    var top = nice(max);
    var x = function (i) { return L + (n > 1 ? i * (W - L - R) / (n - 1) : 0); };
    var y = function (v) { return T + (H - T - B) * (1 - v / top); };
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "class": "kj-svg"});
    var title = el("title");
    title.textContent = series.map(function (s) { return s.name; }).join(", ");
    svg.appendChild(title);
    for (var g = 0; g <= 4; g++) {
      var v = top * g / 4, gy = y(v);
      svg.appendChild(el("line", {x1: L, x2: W - R, y1: gy, y2: gy, "class": "kj-grid-line"}));
      var t = el("text", {x: L - 4, y: gy + 4, "text-anchor": "end", "class": "kj-axis"});
      t.textContent = v >= 1000 ? (v / 1000) + "k" : String(Math.round(v * 100) / 100);
      svg.appendChild(t);
    }
    [0, Math.floor((n - 1) / 2), n - 1].forEach(function (i) {
      if (i < 0 || !labels[i]) return;
      var t = el("text", {x: x(i), y: H - 6, "text-anchor": i === 0 ? "start" : (i === n - 1 ? "end" : "middle"), "class": "kj-axis"});
      t.textContent = labels[i];
      svg.appendChild(t);
    });
    var every = Math.max(1, Math.ceil(n / 24));
    series.forEach(function (s, k) {
      var cls = "kj-series kj-s" + (k % DASHES.length), d = "", pen = false;
      s.values.forEach(function (v, i) {
        if (v == null) { pen = false; return; }
        d += (pen ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
        pen = true;
      });
      var path = el("path", {d: d, "class": cls, fill: "none"});
      if (DASHES[k % DASHES.length]) path.setAttribute("stroke-dasharray", DASHES[k % DASHES.length]);
      svg.appendChild(path);
      s.values.forEach(function (v, i) {
        // A point with no neighbour draws no line: its marker is all that shows it.
        var alone = (i === 0 || s.values[i - 1] == null) && (i === n - 1 || s.values[i + 1] == null);
        if (v != null && (i % every === 0 || i === n - 1 || alone)) svg.appendChild(marker(MARKERS[k % MARKERS.length], x(i), y(v), cls));
      });
    });
    var legend = document.createElement("ul");
    legend.className = "kj-legend";
    series.forEach(function (s, k) {
      var item = document.createElement("li");
      var key = el("svg", {width: 30, height: 10, "aria-hidden": "true"});
      var cls = "kj-series kj-s" + (k % DASHES.length);
      var p = el("path", {d: "M2 5L28 5", "class": cls, fill: "none"});
      if (DASHES[k % DASHES.length]) p.setAttribute("stroke-dasharray", DASHES[k % DASHES.length]);
      key.appendChild(p);
      key.appendChild(marker(MARKERS[k % MARKERS.length], 15, 5, cls));
      item.appendChild(key);
      var last = null;
      for (var i = s.values.length - 1; i >= 0; i--) if (s.values[i] != null) { last = s.values[i]; break; }
      item.appendChild(document.createTextNode(" " + s.name + (last != null ? " (" + last + ")" : "")));
      legend.appendChild(item);
    });
    target.textContent = "";
    target.appendChild(svg);
    target.appendChild(legend);
    target.dataset.points = JSON.stringify({labels: labels, series: series});
  }

  window.KumikoCharts = {line: line};
})();
