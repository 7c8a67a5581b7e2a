/* gatekeeper dashboard: draws each <figure class="chart"> of a target page with uPlot
 * from the page's JSON (#gk-data). After a chart is drawn its figure records what was
 * drawn: data-points (commits with at least one point inside the plotted area),
 * data-values (points drawn, all series), data-series and data-box (the plotting area:
 * x,y,width,height in page pixels); <body data-charts-rendered>
 * counts the charts drawn. The browser test reads these. Clicking a point opens its
 * commit. No network: uPlot is loaded from ../assets/. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("gk-data").textContent);
  var rendered = 0;

  function fmt(v, compact) {
    if (v == null) return "–";
    if (compact) {
      return new Intl.NumberFormat("en", {notation: "compact", maximumSignificantDigits: 3})
        .format(v);
    }
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function drawn(u) {
    // what this draw put inside the plotting area: a point counts when both of its
    // coordinates fall within the current scales
    var xs = u.scales.x, commits = {}, values = 0;
    for (var s = 1; s < u.series.length; s++) {
      if (!u.series[s].show) continue;
      var ys = u.data[s], sc = u.scales[u.series[s].scale];
      for (var i = 0; i < ys.length; i++) {
        var x = u.data[0][i], y = ys[i];
        if (y == null || x < xs.min || x > xs.max || y < sc.min || y > sc.max) continue;
        commits[i] = true;
        values++;
      }
    }
    return {points: Object.keys(commits).length, values: values};
  }

  function chart(fig, spec) {
    var plot = fig.querySelector(".plot");
    var width = Math.max(280, plot.clientWidth || 560);
    var series = [{
      label: "commit",
      value: function (u, i) {
        return i == null ? "–" : data.labels[i] + " · " + data.measured[i];
      }
    }];
    spec.series.forEach(function (s) {
      series.push({
        label: s.label, stroke: s.color, width: 2, spanGaps: true,
        points: {show: true, size: 7, fill: s.color, stroke: s.color},
        value: function (u, v) { return fmt(v, spec.compact); }
      });
    });
    var opts = {
      width: width, height: 220,
      scales: {
        x: {time: false, range: function (u, min, max) { return [min - 0.5, max + 0.5]; }}
      },
      axes: [
        {space: 70, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000],
         values: function (u, splits) {
           return splits.map(function (v) {
             return Number.isInteger(v) && data.labels[v] != null ? data.labels[v] : "";
           });
         }},
        {size: 64, values: function (u, splits) {
          return splits.map(function (v) { return fmt(v, spec.compact); });
        }}
      ],
      series: series,
      cursor: {points: {size: 9}},
      hooks: {
        draw: [function (u) {
          var d = drawn(u);
          fig.dataset.points = d.points;
          fig.dataset.values = d.values;
          fig.dataset.series = u.series.length - 1;
          var r = u.over.getBoundingClientRect();  // the plotting area, in page pixels
          fig.dataset.box = [r.left + window.scrollX, r.top + window.scrollY, r.width,
                             r.height].map(Math.round).join(",");
          if (!fig.dataset.rendered) {
            fig.dataset.rendered = "true";
            rendered++;
            document.body.dataset.chartsRendered = rendered;
          }
        }]
      }
    };
    var cols = [data.x].concat(spec.series.map(function (s) { return s.values; }));
    var u = new uPlot(opts, cols, plot);
    u.over.addEventListener("click", function () {
      var i = u.cursor.idx;
      if (i != null && data.urls[i]) window.open(data.urls[i], "_blank", "noopener");
    });
    u.over.style.cursor = "pointer";
    return u;
  }

  var specs = {};
  data.charts.forEach(function (c) { specs[c.id] = c; });
  document.querySelectorAll("figure.chart").forEach(function (fig) {
    var spec = specs[fig.dataset.chart];
    if (spec) chart(fig, spec);
  });
})();
