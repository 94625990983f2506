/* kumiko_jobs: fills the dashboard (operators) or the console (a tenant) from its JSON endpoint
 * every few seconds. Text goes in through textContent only: job names, error types and tenants
 * are data, never markup. */
"use strict";
(function () {
  var root = document.getElementById("kj-dashboard");
  if (!root) return;
  var kind = root.dataset.kind, url = root.dataset.url;
  var refresh = Math.max(2, parseInt(root.dataset.refresh, 10) || 5) * 1000;
  var query = window.location.search;
  var form = root.querySelector(".kj-filters");
  new URLSearchParams(query).forEach(function (value, name) {
    if (form.elements[name]) form.elements[name].value = value;
  });

  function q(sel) { return root.querySelector(sel); }

  function table(target, head, rows) {
    var t = document.createElement("table"), tr = document.createElement("tr");
    head.forEach(function (h) { var th = document.createElement("th"); th.textContent = h; tr.appendChild(th); });
    var thead = document.createElement("thead"); thead.appendChild(tr); t.appendChild(thead);
    var body = document.createElement("tbody");
    if (!rows.length) {
      var empty = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = head.length; td.textContent = "—"; empty.appendChild(td); body.appendChild(empty);
    }
    rows.forEach(function (cells) {
      var row = document.createElement("tr");
      cells.forEach(function (c) {
        var td = document.createElement("td");
        if (c && typeof c === "object" && c.href) {
          var a = document.createElement("a"); a.href = c.href; a.textContent = c.text; td.appendChild(a);
        } else td.textContent = c == null ? "—" : String(c);
        row.appendChild(td);
      });
      body.appendChild(row);
    });
    t.appendChild(body);
    target.textContent = "";
    target.appendChild(t);
  }

  function label(iso, step) {
    var d = new Date(iso);
    return step >= 86400 || kind === "console" ? iso.slice(0, 10) : d.toISOString().slice(step >= 3600 ? 5 : 11, 16).replace("T", " ");
  }

  function when(iso) { return iso.slice(0, 19).replace("T", " ") + " UTC"; }

  function percentiles(points, field) {
    return ["p50", "p95", "p99"].map(function (name, i) {
      return {name: name, values: points.map(function (p) { return p[field] ? p[field][i] : null; })};
    });
  }

  function counts(points, fields) {
    return fields.map(function (f) { return {name: f, values: points.map(function (p) { return p[f]; })}; });
  }

  function chart(name, labels, series) {
    var target = q('[data-chart="' + name + '"]');
    if (target) window.KumikoCharts.line(target, {labels: labels, series: series});
  }

  // A "pause…" link to the pauses' add form, its field filled in (operators who may pause),
  // or the word "paused" when that thing is paused already.
  function pauseCell(data, field, value) {
    var paused = data.pauses.some(function (p) {
      return p[field] === value && ["queue", "job_name", "schema_name"].every(function (f) { return f === field || !p[f]; });
    });
    if (paused) return "paused";
    if (!data.pause_url || !value) return null;
    return {href: data.pause_url + "?" + field + "=" + encodeURIComponent(value), text: "pause…"};
  }

  function operator(data) {
    var points = data.series.points, step = data.series.step_seconds;
    var can = data.pause_url ? ["act"] : [];
    var labels = points.map(function (p) { return label(p.t, step); });
    chart("throughput", labels, counts(points, ["started", "succeeded", "failed", "retried", "deferred"]));
    chart("wait", labels, percentiles(points, "wait_ms"));
    chart("duration", labels, percentiles(points, "duration_ms"));
    table(q('[data-table="queues"]'), ["queue", "waiting", "held by workers"].concat(can),
      data.queues.map(function (x) { return [x.queue, x.waiting, x.started].concat(can.length ? [pauseCell(data, "queue", x.queue)] : []); }));
    table(q('[data-table="pauses"]'), ["queue", "job", "tenant", "paused", "by", "act"],
      data.pauses.map(function (p) {
        return [p.queue || "—", p.job_name || "—", p.schema_name || "—", when(p.paused_at), p.paused_by || "—",
          p.resume_link ? {href: p.resume_link, text: "resume…"} : null];
      }));
    q('[data-text="running"]').textContent = "running runs: " + data.running;
    q('[data-text="scheduler"]').textContent = data.scheduler || data.redis_error || "";
    // A tenant's rows hold the system runs its runs started (as the fair dequeue counts them);
    // "of which system runs" says how much of it they are.
    table(q('[data-table="backlog"]'), ["tenant", "waiting", "of which system runs", "oldest queued"].concat(can),
      data.backlog.tenants.map(function (x) {
        return [x.tenant || "system", x.waiting, x.system, when(x.oldest)].concat(can.length ? [pauseCell(data, "schema_name", x.tenant)] : []);
      }));
    table(q('[data-table="worker_time"]'), ["tenant", "worker time (ms)", "of which system runs (ms)", "share"],
      data.worker_time.map(function (x) { return [x.tenant || "system", Math.round(x.ms), Math.round(x.system_ms), (100 * x.share).toFixed(1) + " %"]; }));
    table(q('[data-table="workers"]'), ["worker", "queues", "state", "run", "busy for (s)", "last heartbeat (s ago)"],
      data.workers.listed.map(function (w) {
        return [w.name + (w.kumiko ? "" : " (no kumiko beat)"), w.queues.join(", "), w.state, w.run_id || w.rq_job_id, w.busy_for_s, w.heartbeat_ago_s];
      }));
    var canRetry = data.failures.some(function (f) { return f.retry_link; });
    table(q('[data-table="failures"]'), ["job", "error", "runs", "last"].concat(canRetry ? ["act"] : []).concat(can),
      data.failures.map(function (f) {
        var row = [{href: f.link, text: f.job + (f.system ? " (system runs)" : "")}, f.error_type || "—", f.count, when(f.last)];
        if (canRetry) row.push({href: f.retry_link, text: "retry all…"});
        return can.length ? row.concat([pauseCell(data, "job_name", f.job)]) : row;
      }));
  }

  function console_(data) {
    var labels = data.days.map(function (p) { return p.t; });
    chart("days", labels, counts(data.days, ["runs", "succeeded", "failed"]));
    chart("wait", labels, percentiles(data.days, "wait_ms"));
    chart("duration", labels, percentiles(data.days, "duration_ms"));
    table(q('[data-table="jobs"]'), ["job", "finished", "failed", "failure rate"],
      data.jobs.map(function (j) {
        // A job that failed links to its failed runs in the tenant's run list (retry is there).
        var failed = j.failed_link ? {href: j.failed_link, text: String(j.failed)} : j.failed;
        return [j.job, j.finished, failed, (100 * j.rate).toFixed(1) + " %"];
      }));
  }

  function load() {
    var status = q(".kj-status"), error = q(".kj-error");
    fetch(url + query, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json().then(function (body) { return {ok: r.ok, body: body}; }); })
      .then(function (res) {
        if (!res.ok) throw new Error(res.body.error || "request refused");
        error.hidden = true;
        (kind === "console" ? console_ : operator)(res.body);
        status.textContent = "updated " + res.body.generated_at.slice(11, 19) + " UTC";
      })
      .catch(function (e) { error.hidden = false; error.textContent = String(e.message || e); })
      .finally(function () { window.setTimeout(load, refresh); });
  }
  load();
})();
