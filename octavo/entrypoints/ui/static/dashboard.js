// The dashboard: the engine's configuration (/ui/api/config) and live charts
// of /ui/api/stats, polled every second. The server sends cumulative
// counters and histogram buckets; rates, windowed hit rates and percentiles
// are the differences between samples kept here (up to 15 minutes, from
// when the page opened).
"use strict";

(() => {
  const { $, request, withKey, showBanner } = Octavo;
  const POLL_MS = 1000;
  const MAX_WINDOW_S = 900; // the longest window offered: samples are kept this long
  const RATE_WINDOW_S = 5; // tokens/s, preemptions/s: averaged over this
  const HIT_WINDOW_S = 10; // prefix-cache hit rate over this
  const LATENCY_WINDOW_S = 30; // percentiles of the observations in this
  const QUANTILES = [0.5, 0.9, 0.99];

  const samples = []; // raw /ui/api/stats answers, oldest first
  const points = []; // what the charts plot, one per sample
  let charts = null;

  // ------------------------------------------------------------- derivation

  const total = (sample, name) => sample.series[name] || 0;
  const labelled = (sample, name) => sample.labelled[name] || {};
  const sum = (values) => values.reduce((a, b) => a + b, 0);
  const errors = (sample) => (labelled(sample, "request_success").error || 0) +
    sum(Object.values(labelled(sample, "requests_rejected")));
  const aborts = (sample) => labelled(sample, "request_success").abort || 0;

  // The oldest sample no more than `seconds` before samples[index] (itself if none).
  function baseline(index, seconds) {
    let j = index;
    while (j > 0 && samples[index].time - samples[j - 1].time <= seconds) j--;
    return samples[j];
  }

  // Per second between two samples of a counter; null without two samples or after a restart.
  function rate(now, then, valueOf) {
    const seconds = now.time - then.time;
    const delta = valueOf(now) - valueOf(then);
    return seconds > 0 && delta >= 0 ? delta / seconds : null;
  }

  function hitRate(hits, queries) {
    return queries > 0 && hits >= 0 ? (100 * hits) / queries : null;
  }

  // Prometheus' histogram_quantile over cumulative bucket counts (le: upper bounds, null = +Inf).
  function quantile(q, le, counts) {
    const count = counts[counts.length - 1];
    if (!(count > 0)) return null;
    const rank = q * count;
    let below = 0;
    let lower = 0;
    for (let i = 0; i < counts.length; i++) {
      if (counts[i] >= rank) {
        if (le[i] === null) return lower; // in the open top bucket: its lower bound
        const inBucket = counts[i] - below;
        return lower + (le[i] - lower) * (inBucket > 0 ? (rank - below) / inBucket : 1);
      }
      below = counts[i];
      lower = le[i] === null ? lower : le[i];
    }
    return lower;
  }

  function percentilesMs(now, then, name) {
    const current = now.histograms[name];
    const old = then.histograms[name];
    if (!current || !old || now === then) return QUANTILES.map(() => null);
    const counts = current.counts.map((count, i) => count - old.counts[i]);
    return QUANTILES.map((q) => {
      const seconds = quantile(q, current.le, counts);
      return seconds === null ? null : seconds * 1000;
    });
  }

  function replicaPoint(now, hitBase, rateBase, r) {
    const replica = now.replicas[r];
    const hitOld = hitBase.replicas[r] || replica;
    const rateOld = rateBase.replicas[r] || replica;
    return {
      running: replica.num_requests_running,
      waiting: replica.num_requests_waiting,
      kv: 100 * replica.kv_cache_usage_perc,
      hit: hitRate(replica.prefix_cache_hits - hitOld.prefix_cache_hits,
        replica.prefix_cache_queries - hitOld.prefix_cache_queries),
      preemptions: rate({ time: now.time, v: replica.num_preemptions }, { time: rateBase.time, v: rateOld.num_preemptions }, (s) => s.v),
    };
  }

  function derive(index) {
    const now = samples[index];
    const rateBase = baseline(index, RATE_WINDOW_S);
    const hitBase = baseline(index, HIT_WINDOW_S);
    const latencyBase = baseline(index, LATENCY_WINDOW_S);
    const counter = (name) => (sample) => total(sample, name);
    return {
      time: now.time,
      running: total(now, "num_requests_running"),
      waiting: total(now, "num_requests_waiting"),
      kv: 100 * total(now, "kv_cache_usage_perc"),
      hit: hitRate(total(now, "prefix_cache_hits") - total(hitBase, "prefix_cache_hits"),
        total(now, "prefix_cache_queries") - total(hitBase, "prefix_cache_queries")),
      promptRate: rate(now, rateBase, counter("prompt_tokens")),
      outputRate: rate(now, rateBase, counter("generation_tokens")),
      ttft: percentilesMs(now, latencyBase, "time_to_first_token_seconds"),
      itl: percentilesMs(now, latencyBase, "inter_token_latency_seconds"),
      preemptions: rate(now, rateBase, counter("num_preemptions")),
      errors: rate(now, rateBase, errors),
      aborts: rate(now, rateBase, aborts),
      replicas: now.replicas.map((_, r) => replicaPoint(now, hitBase, rateBase, r)),
    };
  }

  // ---------------------------------------------------------------- charts

  // Three significant digits below 100 (0.25, 12.3), whole numbers above.
  const count = (v) => (Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(3))));
  const percent = (v) => `${count(v)}%`;
  const ms = (v) => `${count(v)} ms`;

  const CHARTS = [
    { id: "requests", title: "Requests running and waiting", format: count,
      series: (p) => [["running", p.running], ["waiting", p.waiting]],
      replicas: (r) => [["running", r.running], ["waiting", r.waiting]] },
    { id: "kv", title: "KV-cache usage", format: percent, max: 100,
      series: (p) => [["used", p.kv]], replicas: (r) => [["used", r.kv]] },
    { id: "prefix", title: `Prefix-cache hit rate (last ${HIT_WINDOW_S} s)`, format: percent, max: 100,
      series: (p) => [["hit rate", p.hit]], replicas: (r) => [["hit rate", r.hit]] },
    { id: "tokens", title: "Tokens per second", format: count,
      series: (p) => [["prompt tokens/s", p.promptRate], ["output tokens/s", p.outputRate]] },
    { id: "ttft", title: `Time to first token (last ${LATENCY_WINDOW_S} s)`, format: ms,
      series: (p) => QUANTILES.map((q, i) => [`p${q * 100}`, p.ttft[i]]) },
    { id: "itl", title: `Inter-token latency (last ${LATENCY_WINDOW_S} s)`, format: ms,
      series: (p) => QUANTILES.map((q, i) => [`p${q * 100}`, p.itl[i]]) },
    { id: "events", title: "Preemptions, errors and aborts per second", format: count,
      series: (p) => [["preemptions", p.preemptions], ["errors", p.errors], ["aborts", p.aborts]],
      replicas: (r) => [["preemptions", r.preemptions]] },
  ];

  // One line per series; with several replicas, also one per replica and series.
  function chartSeries(spec) {
    const last = points[points.length - 1];
    const lines = spec.series(last).map(([label], i) => ({ label, values: points.map((p) => spec.series(p)[i][1]) }));
    const numReplicas = last.replicas.length;
    if (spec.replicas && numReplicas > 1) {
      for (let r = 0; r < numReplicas; r++) {
        spec.replicas(last.replicas[r]).forEach(([label], i) => {
          lines.push({ label: `replica ${r} ${label}`, values: points.map((p) => (p.replicas[r] ? spec.replicas(p.replicas[r])[i][1] : null)) });
        });
      }
    }
    return lines;
  }

  function setWindow() {
    for (const chart of charts) chart.options.windowSeconds = Number($("window").value);
    redraw();
  }

  function redraw() {
    if (!charts || !points.length) return;
    const times = points.map((p) => p.time);
    CHARTS.forEach((spec, i) => charts[i].update(times, chartSeries(spec)));
  }

  // ---------------------------------------------------------------- config

  function showConfig(config) {
    const rows = [
      ["Model", config.served_model_names.join(", ")],
      ["Path", config.model_path],
      ["Architecture", config.architecture],
      ["Dtype", config.dtype],
      ["KV-cache dtype", config.kv_cache_dtype],
      ["Platform", config.platform],
      ["Attention backend", (config.attention_backends || []).join(", ") || "not reported"],
      ["Quantization", config.quantization || "none"],
      ["Token budget", `${config.max_num_batched_tokens} tokens per step`],
      ["Max sequences", config.max_num_seqs],
      ["Max model length", config.max_model_len],
      ["KV cache", `${config.num_kv_blocks} blocks of ${config.block_size} tokens`],
      ["Replicas", config.num_replicas],
      ["Parallelism", `tensor ${config.tensor_parallel_size}, pipeline ${config.pipeline_parallel_size}`],
      ["Prefix caching", config.enable_prefix_caching ? "on" : "off"],
      ["Chunked prefill", config.enable_chunked_prefill ? "on" : "off"],
      ["Octavo", config.version],
    ];
    $("config").replaceChildren(...rows.flatMap(([name, value]) => {
      const term = document.createElement("dt");
      term.textContent = name;
      const detail = document.createElement("dd");
      detail.textContent = value == null ? "–" : String(value);
      return [term, detail];
    }));
  }

  function showStatus(sample) {
    const alive = total(sample, "engine_alive") === 1;
    const inflight = total(sample, "num_inflight_sequences");
    const time = new Date(sample.time * 1000).toLocaleTimeString();
    $("status").textContent = `${alive ? "Engine running" : "Engine stopped"} · ${inflight} sequences in flight · updated ${time}`;
    $("status").classList.toggle("danger", !alive);
  }

  // ------------------------------------------------------------------ loop

  async function poll() {
    try {
      const sample = await (await withKey(() => request("/ui/api/stats"))).json();
      samples.push(sample);
      points.push(derive(samples.length - 1));
      while (samples.length > 1 && sample.time - samples[0].time > MAX_WINDOW_S + LATENCY_WINDOW_S) {
        samples.shift();
        points.shift();
      }
      showStatus(sample);
      redraw();
      showBanner("");
    } catch (error) {
      showBanner(`${error.message} (retrying every ${POLL_MS / 1000} s)`);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  async function init() {
    Octavo.initChrome();
    charts = CHARTS.map((spec) => new OctavoCharts.LineChart($("charts"), spec));
    setWindow();
    $("window").addEventListener("change", setWindow);
    window.addEventListener("resize", redraw);
    document.addEventListener("octavo-theme", redraw);
    for (;;) {
      try {
        showConfig(await (await withKey(() => request("/ui/api/config"))).json());
        showBanner("");
        break;
      } catch (error) {
        showBanner(`${error.message} (retrying)`);
        await new Promise((resolve) => setTimeout(resolve, POLL_MS * 2));
      }
    }
    poll();
  }

  init();
})();
