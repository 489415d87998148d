// A small line chart drawn on a <canvas>: time on x (the last `windowSeconds`,
// "now" at the right), one or more series on y from 0 to a rounded maximum
// (or a fixed one), gaps where a value is null. The legend under it is plain
// DOM text, one entry per series with its latest value.
"use strict";

const OctavoCharts = (() => {
  const PALETTE = ["--c1", "--c2", "--c3", "--c4", "--c5", "--c6"];

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  // 1, 2 or 5 times a power of ten, at least `value` (an axis top that reads well).
  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
    return 10 * power;
  }

  class LineChart {
    // options: {id, title, format(value) -> text, max (fixed top, optional), windowSeconds}
    constructor(container, options) {
      this.options = options;
      this.figure = document.createElement("figure");
      this.figure.className = "chart";
      this.figure.dataset.chart = options.id;
      const caption = document.createElement("figcaption");
      caption.textContent = options.title;
      this.canvas = document.createElement("canvas");
      this.canvas.setAttribute("role", "img");
      this.canvas.setAttribute("aria-label", options.title);
      this.legend = document.createElement("ul");
      this.legend.className = "legend";
      this.figure.append(caption, this.canvas, this.legend);
      container.appendChild(this.figure);
      this.times = [];
      this.series = [];
    }

    // times: seconds; series: [{label, values}] (values aligned with times).
    update(times, series) {
      this.times = times;
      this.series = series;
      this.draw();
      this.renderLegend();
    }

    renderLegend() {
      const format = this.options.format;
      this.legend.replaceChildren(...this.series.map((series, index) => {
        const item = document.createElement("li");
        item.dataset.label = series.label;
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = cssVar(PALETTE[index % PALETTE.length]);
        const value = document.createElement("span");
        value.className = "value";
        const latest = series.values.length ? series.values[series.values.length - 1] : null;
        value.textContent = latest == null ? "–" : format(latest);
        item.append(swatch, document.createTextNode(series.label), value);
        return item;
      }));
    }

    draw() {
      const canvas = this.canvas;
      const ratio = window.devicePixelRatio || 1;
      const width = canvas.clientWidth;
      const height = canvas.clientHeight;
      if (!width || !height) return;
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      const context = canvas.getContext("2d");
      context.setTransform(ratio, 0, 0, ratio, 0, 0);
      context.clearRect(0, 0, width, height);
      const plot = { left: 54, right: width - 8, top: 8, bottom: height - 18 };
      const now = this.times.length ? this.times[this.times.length - 1] : 0;
      const start = now - this.options.windowSeconds;
      let top = this.options.max;
      if (top === undefined) {
        const visible = (value, i) => value != null && this.times[i] >= start;
        const values = this.series.flatMap((series) => series.values.filter(visible));
        top = niceMax(Math.max(0, ...values));
      }
      const x = (time) => plot.left + ((time - start) / this.options.windowSeconds) * (plot.right - plot.left);
      const y = (value) => plot.bottom - (Math.min(value, top) / top) * (plot.bottom - plot.top);
      this.drawAxes(context, plot, top, y);
      this.series.forEach((series, index) => {
        context.strokeStyle = cssVar(PALETTE[index % PALETTE.length]);
        context.fillStyle = context.strokeStyle;
        context.lineWidth = 1.6;
        const shown = (i) => series.values[i] != null && this.times[i] >= start;
        context.beginPath();
        series.values.forEach((value, i) => {
          if (!shown(i)) return;
          const [px, py] = [x(this.times[i]), y(value)];
          if (shown(i - 1)) context.lineTo(px, py);
          else context.moveTo(px, py);
          if (!shown(i - 1) && !shown(i + 1)) context.fillRect(px - 1.5, py - 1.5, 3, 3); // a lone point
        });
        context.stroke();
      });
    }

    drawAxes(context, plot, top, y) {
      context.font = "11px system-ui, sans-serif";
      context.fillStyle = cssVar("--muted");
      context.strokeStyle = cssVar("--grid");
      context.lineWidth = 1;
      context.textAlign = "right";
      context.textBaseline = "middle";
      for (let step = 0; step <= 4; step++) {
        const value = (top * step) / 4;
        const level = Math.round(y(value)) + 0.5;
        context.beginPath();
        context.moveTo(plot.left, level);
        context.lineTo(plot.right, level);
        context.stroke();
        context.fillText(this.options.format(value), plot.left - 6, level);
      }
      context.textBaseline = "top";
      context.textAlign = "left";
      context.fillText(`-${Math.round(this.options.windowSeconds / 60)} min`, plot.left, plot.bottom + 4);
      context.textAlign = "right";
      context.fillText("now", plot.right, plot.bottom + 4);
    }
  }

  return { LineChart };
})();
