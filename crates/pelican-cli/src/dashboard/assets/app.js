// The pelican dashboard: draws the overview (/) or one queue (/queues/{queue}) from the
// JSON API, once a second. Plain DOM, no framework; every text goes in as text.
"use strict";
(() => {
  const POLL_MS = 1000;
  const DEAD_POLL_MS = 2000;
  const SVGNS = "http://www.w3.org/2000/svg";
  let INFO = null;

  // ---------- small helpers ----------
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    setAttrs(e, attrs);
    for (const k of kids.flat(Infinity)) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    setAttrs(e, attrs);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function setAttrs(e, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.setAttribute("class", v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
  }

  async function api(path, opts) {
    const res = await fetch("/api" + path, Object.assign({
      credentials: "same-origin",
      headers: { "Accept": "application/json" },
    }, opts || {}));
    let body = null;
    try { body = await res.json(); } catch (_) { /* not JSON */ }
    if (!res.ok) {
      // {"error": {"kind": ..., "message": ...}}
      const e = body && body.error;
      const err = new Error((e && e.message) || ("HTTP " + res.status));
      err.status = res.status;
      err.kind = e && e.kind;
      throw err;
    }
    return body;
  }

  const nf = new Intl.NumberFormat("en-US");
  const int = (n) => (n === null || n === undefined ? "–" : nf.format(n));

  function rate(r) {
    if (!r) return "0";
    if (r >= 100) return nf.format(Math.round(r));
    if (r >= 10) return r.toFixed(1);
    return r.toFixed(2);
  }

  function dur(ms) {
    if (ms === null || ms === undefined) return "–";
    if (ms < 10) return ms.toFixed(1) + " ms";
    if (ms < 1000) return Math.round(ms) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(2) + " s";
    const s = Math.round(ms / 1000);
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function when(epochMs) {
    if (!epochMs) return "–";
    const d = Date.now() - epochMs;
    return d >= 0 ? dur(d) + " ago" : "in " + dur(-d);
  }

  function toast(text, bad) {
    const t = $("toast");
    t.textContent = text;
    t.className = "toast" + (bad ? " bad" : "");
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
  }

  function status(kind, text) {
    const s = $("status");
    s.className = "status " + kind;
    s.textContent = text;
  }

  // ---------- charts: inline SVG ----------
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // Draws series of points into `box` (its width is measured): a window of the last
  // `windowMs` ending at the newest point. series: [{key, cls, area}].
  function plot(box, points, series, fmt, windowMs, big) {
    const W = Math.max(240, Math.floor(box.clientWidth || 520));
    const H = big ? 180 : 120;
    const L = 46, R = 8, T = 8, B = 20;
    const s = svg("svg", { class: "plot" + (big ? " big" : ""), viewBox: `0 0 ${W} ${H}`, role: "img" });
    const end = points.length ? points[points.length - 1].t : Date.now();
    const start = end - windowMs;
    let top = 0;
    for (const p of points) for (const se of series) top = Math.max(top, p[se.key] || 0);
    top = niceMax(top);
    const x = (t) => L + ((t - start) / windowMs) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    for (const f of [0, 0.5, 1]) {
      const yy = y(top * f);
      s.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: yy, y2: yy }));
      s.append(svg("text", { class: "axis", x: L - 6, y: yy + 3.5, "text-anchor": "end" }, f === 0 ? "0" : fmt(top * f)));
    }
    s.append(svg("text", { class: "axis", x: L, y: H - 4 }, dur(windowMs).replace("m00s", " min") + " ago"));
    s.append(svg("text", { class: "axis", x: W - R, y: H - 4, "text-anchor": "end" }, "now"));
    const shown = points.filter((p) => p.t >= start);
    for (const se of series) {
      if (!shown.length) continue;
      const pts = shown.map((p) => `${x(p.t).toFixed(1)},${y(p[se.key] || 0).toFixed(1)}`);
      if (se.area) {
        const d = `M${x(shown[0].t).toFixed(1)},${y(0)} L${pts.join(" L")} L${x(shown[shown.length - 1].t).toFixed(1)},${y(0)} Z`;
        s.append(svg("path", { class: "area " + se.cls, d }));
      }
      s.append(svg("polyline", { class: "line " + se.cls, points: pts.join(" ") }));
    }
    box.replaceChildren(s);
  }

  function legend(cls, label, value) {
    return el("span", { class: "legend " + cls }, el("i"), label + " ", el("b", {}, value));
  }

  // The numbers and the two charts of one queue (overview card or queue page).
  function live(q, history, big) {
    const windowMs = (INFO.history || 300) * (INFO.interval_ms || 1000);
    const stat = (key, label, value, unit, bad) =>
      el("div", { class: "stat" + (bad ? " bad" : ""), "data-stat": key },
        el("div", { class: "label" }, label),
        el("div", { class: "value" }, value, unit ? el("small", {}, unit) : null));
    const stats = el("div", { class: "stats" },
      stat("queued", "Queued", int(q.queued)),
      stat("in_flight", "In flight", int(q.in_flight)),
      stat("consumers", "Consumers", int(q.consumers)),
      stat("oldest_in_flight", "Oldest in flight", dur(q.oldest_in_flight_ms)),
      stat("dead_letters", "Dead letters", int(q.dead_letters), null, q.dead_letters > 0),
      stat("submitted", "Submitted", int(q.entries_added)));
    const tput = el("div", { class: "plotbox" });
    const age = el("div", { class: "plotbox" });
    const charts = el("div", { class: "charts" },
      el("div", { class: "chart" },
        el("div", { class: "title" }, el("b", {}, "Throughput"), "requests/s",
          legend("blue", "submitted", rate(q.submitted_per_s)),
          legend("green", "finished", rate(q.finished_per_s))),
        tput),
      el("div", { class: "chart" },
        el("div", { class: "title" }, el("b", {}, "Latency"), "oldest request's wait",
          legend("amber", "now", dur(q.oldest_request_ms))),
        age));
    const draw = () => {
      plot(tput, history, [
        { key: "submitted", cls: "blue", area: true },
        { key: "finished", cls: "green" },
      ], rate, windowMs, big);
      plot(age, history, [{ key: "oldest_ms", cls: "amber", area: true }], dur, windowMs, big);
    };
    return { node: el("div", {}, stats, charts), draw };
  }

  // ---------- the overview ----------
  const cards = new Map();

  async function overview() {
    document.title = "Queues · pelican";
    const app = $("app");
    const count = el("span", { class: "sub" });
    const banner = el("div");
    const list = el("div", { id: "queues" });
    app.replaceChildren(
      el("div", { class: "page-head" }, el("h1", {}, "Queues"), count),
      banner, list);
    for (;;) {
      try {
        const d = await api("/queues");
        banner.replaceChildren(d.error ? el("div", { class: "banner" }, d.error + " — showing the last numbers read.") : "");
        status(d.error ? "down" : "live", d.error ? "Redis unreachable" : "live");
        count.textContent = `${d.queues.length} queue${d.queues.length === 1 ? "" : "s"} under prefix “${INFO.prefix}” · the last ${Math.round(INFO.history * INFO.interval_ms / 60000)} minutes`;
        drawCards(list, d.queues);
      } catch (e) {
        status("down", "dashboard unreachable");
      }
      await sleep(POLL_MS);
    }
  }

  function drawCards(list, queues) {
    const names = new Set(queues.map((q) => q.name));
    for (const [name, c] of cards) if (!names.has(name)) { c.card.remove(); cards.delete(name); }
    if (!queues.length) {
      list.replaceChildren(el("div", { class: "card empty" },
        `No queues under prefix “${INFO.prefix}” yet. They appear here once a worker or a producer has used one (try `,
        el("code", {}, "pelican demo --keep"), ")."));
      return;
    }
    list.querySelector(".empty")?.remove();
    for (const q of queues) {
      let c = cards.get(q.name);
      if (!c) {
        const liveBox = el("div");
        const badge = el("span", { class: "badge" });
        const card = el("section", { class: "card queue", "data-queue": q.name },
          el("div", { class: "head" },
            el("h2", {}, el("a", { href: "/queues/" + encodeURIComponent(q.name), "data-link": "queue" }, q.name)),
            badge,
            el("div", { class: "actions" }, el("a", { href: "/queues/" + encodeURIComponent(q.name) }, "Consumers and dead letters →"))),
          liveBox);
        c = { card, liveBox, badge };
        cards.set(q.name, c);
      }
      list.append(c.card); // keeps the order sorted (the API sorts by name)
      c.badge.textContent = q.partitions.length > 1 ? `${q.partitions.length} partitions` : "";
      c.badge.hidden = q.partitions.length <= 1;
      const l = live(q, q.history, false);
      c.liveBox.replaceChildren(l.node);
      l.draw();
    }
  }

  // ---------- one queue ----------
  async function queuePage(name) {
    document.title = name + " · pelican";
    const app = $("app");
    const banner = el("div");
    const sub = el("span", { class: "sub" });
    const liveCard = el("section", { class: "card", id: "live" }, el("div", { class: "empty" }, "Loading…"));
    const consumersBody = el("div", { class: "body", id: "consumers" });
    const partsBody = el("div", { id: "partitions" });
    const partsCard = el("section", { class: "card", id: "partitions-card", hidden: true },
      el("div", { class: "head" }, el("h2", {}, "Partitions"), el("span", { class: "hint" }, "each partition's figures; the numbers above add them up")),
      partsBody);
    const deadBody = el("div", { id: "dead" });
    const deadCount = el("span", { class: "badge", id: "dead-count" });
    const canMutate = INFO.can_mutate && !INFO.read_only;
    const purgeBtn = el("button", { class: "danger", "data-action": "purge", disabled: !canMutate });
    purgeBtn.textContent = "Purge all";
    const requeueAllBtn = el("button", { "data-action": "requeue-all", disabled: !canMutate });
    requeueAllBtn.textContent = "Requeue all";
    const mutationHint = INFO.read_only
      ? el("span", { class: "hint" }, "read-only dashboard")
      : (!INFO.can_mutate ? el("span", { class: "hint" }, "open the login link printed by ", el("code", {}, "pelican dashboard"), " to requeue or purge") : null);
    const lookupOut = el("div", { id: "lookup-result" });
    const input = el("input", { type: "text", name: "rid", placeholder: "request id, e.g. 3f2a…", autocomplete: "off", spellcheck: "false", "aria-label": "request id" });
    const form = el("form", { class: "lookup" }, input, el("button", { class: "primary", type: "submit" }, "Look up"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); lookup(name, input.value.trim(), lookupOut); });

    app.replaceChildren(
      el("a", { class: "back", href: "/" }, "← All queues"),
      el("div", { class: "page-head" }, el("h1", {}, name), sub),
      banner,
      liveCard,
      partsCard,
      el("div", { class: "grid2" },
        el("section", { class: "card" }, el("div", { class: "head" }, el("h2", {}, "Consumers")), consumersBody),
        el("section", { class: "card" },
          el("div", { class: "head" }, el("h2", {}, "Look up a request")),
          el("div", { class: "body" }, form, lookupOut))),
      el("section", { class: "card", id: "dead-card" },
        el("div", { class: "head" }, el("h2", {}, "Dead letters"), deadCount,
          el("div", { class: "actions" }, INFO.read_only ? null : [mutationHint, requeueAllBtn, purgeBtn].filter(Boolean),
            INFO.read_only ? mutationHint : null)),
        deadBody));

    const refreshDead = async () => {
      try {
        const d = await api(`/queues/${encodeURIComponent(name)}/dead`);
        drawDead(name, d, deadBody, deadCount, canMutate, refreshDead);
        purgeBtn.dataset.count = d.total;
      } catch (e) {
        deadBody.replaceChildren(el("div", { class: "body error-text" }, e.message));
      }
    };
    requeueAllBtn.addEventListener("click", async () => {
      requeueAllBtn.disabled = true;
      try {
        const r = await api(`/queues/${encodeURIComponent(name)}/dead/requeue-all`, { method: "POST" });
        toast(`Requeued ${int(r.requeued)} dead letter${r.requeued === 1 ? "" : "s"}`);
      } catch (e) { toast(e.message, true); }
      requeueAllBtn.disabled = false;
      refreshDead();
    });
    purgeBtn.addEventListener("click", async () => {
      if (!purgeBtn.classList.contains("armed")) {
        purgeBtn.classList.add("armed");
        purgeBtn.textContent = `Click again to delete ${int(Number(purgeBtn.dataset.count || 0))}`;
        setTimeout(() => { purgeBtn.classList.remove("armed"); purgeBtn.textContent = "Purge all"; }, 4000);
        return;
      }
      purgeBtn.classList.remove("armed");
      purgeBtn.textContent = "Purge all";
      try {
        const r = await api(`/queues/${encodeURIComponent(name)}/dead/purge`, { method: "POST" });
        toast(`Deleted ${int(r.purged)} dead letter${r.purged === 1 ? "" : "s"}`);
      } catch (e) { toast(e.message, true); }
      refreshDead();
    });

    (async () => { for (;;) { await refreshDead(); await sleep(DEAD_POLL_MS); } })();
    for (;;) {
      try {
        const d = await api(`/queues/${encodeURIComponent(name)}`);
        banner.replaceChildren(d.error ? el("div", { class: "banner" }, d.error + " — showing the last numbers read.") : "");
        status(d.error ? "down" : "live", d.error ? "Redis unreachable" : "live");
        sub.textContent = d.partitions.length > 1 ? `${d.partitions.length} partitions` : "";
        const l = live(d.queue, d.history, true);
        liveCard.replaceChildren(l.node);
        l.draw();
        drawConsumers(d, consumersBody);
        partsCard.hidden = d.partitions.length <= 1;
        if (!partsCard.hidden) drawPartitions(d, partsBody);
      } catch (e) {
        if (e.status === undefined) status("down", "dashboard unreachable");
        banner.replaceChildren(el("div", { class: "banner" }, e.message));
      }
      await sleep(POLL_MS);
    }
  }

  function drawConsumers(d, body) {
    if (!d.consumers.length) {
      body.replaceChildren(el("div", { class: "empty" }, "No consumers. Start one with ", el("code", {}, "pelican worker"), "."));
      return;
    }
    const multi = d.partitions.length > 1;
    const rows = d.consumers.map((c) => el("tr", { "data-consumer": c.name },
      el("td", {}, el("span", { class: "mono" }, c.name), multi ? el("div", { class: "muted" }, c.partition) : null),
      // what it holds now (the list is read live; the sample may be a second old)
      el("td", { class: "r" }, int(c.held.length >= 100 ? c.pending : c.held.length)),
      el("td", { class: "r" }, dur(c.idle_ms)),
      el("td", {}, c.held.length
        ? el("ul", { class: "held" }, c.held.slice(0, 8).map((h) => el("li", {},
          el("span", { class: "mono", title: h.rid || h.entry }, short(h.rid || h.entry)),
          el("span", { class: "muted" }, `for ${dur(h.age_ms)}`),
          h.deliveries > 1 ? el("span", { class: "muted" }, `delivery ${h.deliveries}`) : null)),
          c.held.length > 8 ? el("li", { class: "muted" }, `… ${c.held.length - 8} more`) : null)
        : el("span", { class: "muted" }, "idle"))));
    body.replaceChildren(el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "Consumer"), el("th", { class: "r" }, "Holds"), el("th", { class: "r" }, "Idle"), el("th", {}, "Working on"))),
      el("tbody", {}, rows)));
  }

  // One row per partition: where it lives (on a cluster, the master serving its slot),
  // what waits, what is in work, who reads it.
  function drawPartitions(d, body) {
    const withNodes = d.partitions.some((p) => p.node);
    const cell = (col, text, cls) => el("td", { class: "r" + (cls ? " " + cls : ""), "data-col": col }, text);
    const rows = d.partitions.map((p) => el("tr", { "data-partition": p.tag },
      el("td", {}, el("span", { class: "mono" }, p.tag)),
      withNodes ? el("td", { "data-col": "node" }, el("span", { class: "mono" }, p.node || "–")) : null,
      cell("queued", int(p.queued)),
      cell("in_flight", int(p.in_flight)),
      cell("length", int(p.length)),
      cell("consumers", int(p.consumers.length)),
      cell("dead_letters", int(p.dead_letters), p.dead_letters > 0 ? "bad" : null),
      cell("submitted", int(p.entries_added)),
      cell("oldest", dur(p.oldest_request_ms))));
    body.replaceChildren(el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "Partition"), withNodes ? el("th", {}, "Node") : null,
        el("th", { class: "r" }, "Queued"), el("th", { class: "r" }, "In flight"), el("th", { class: "r" }, "Stream length"),
        el("th", { class: "r" }, "Consumers"), el("th", { class: "r" }, "Dead letters"), el("th", { class: "r" }, "Submitted"),
        el("th", { class: "r" }, "Oldest request"))),
      el("tbody", {}, rows)));
  }

  function short(s) {
    return s && s.length > 18 ? s.slice(0, 8) + "…" + s.slice(-6) : s;
  }

  function drawDead(name, d, body, countBadge, canMutate, refresh) {
    countBadge.textContent = int(d.total);
    if (!d.letters.length) {
      body.replaceChildren(el("div", { class: "empty", "data-empty": "dead" }, "No dead letters."));
      return;
    }
    const rows = d.letters.map((l) => {
      const btn = el("button", { "data-action": "requeue", disabled: !canMutate,
        title: canMutate ? "Put it back on the queue as a fresh request" : "Log in with the link printed by pelican dashboard" });
      btn.textContent = "Requeue";
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        btn.textContent = "Requeuing…";
        try {
          const r = await api(`/queues/${encodeURIComponent(name)}/dead/${encodeURIComponent(l.id)}/requeue`, { method: "POST" });
          row.remove();
          toast(`Requeued ${l.id} as entry ${r.entry}`);
          refresh();
        } catch (e) {
          toast(e.message, true);
          btn.disabled = false;
          btn.textContent = "Requeue";
        }
      });
      const more = l.body_preview.length < l.body_len ? "…" : "";
      const row = el("tr", { "data-dead-id": l.id, "data-rid": l.rid || "" },
        el("td", {}, el("div", { class: "mono", title: l.rid || "" }, short(l.rid) || "–"), el("div", { class: "muted mono" }, l.id)),
        el("td", { class: "reason" }, l.reason),
        el("td", { class: "r" }, int(l.deliveries)),
        el("td", {}, el("span", { class: "mono" }, l.consumer || "–")),
        el("td", {}, when(l.dead_at_ms)),
        el("td", { class: "preview mono", title: l.body_preview + more }, l.body_preview + more),
        INFO.read_only ? null : el("td", { class: "r" }, btn));
      return row;
    });
    const note = d.total > d.letters.length ? el("div", { class: "hint body" }, `The oldest ${int(d.letters.length)} of ${int(d.total)} are shown.`) : null;
    body.replaceChildren(el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "Request"), el("th", {}, "Reason"), el("th", { class: "r" }, "Deliveries"),
        el("th", {}, "Last consumer"), el("th", {}, "Died"), el("th", {}, "Body"), INFO.read_only ? null : el("th", {}))),
      el("tbody", {}, rows)), ...(note ? [note] : []));
  }

  async function lookup(name, rid, out) {
    if (!rid) { out.replaceChildren(el("p", { class: "error-text" }, "Type a request id.")); return; }
    out.replaceChildren(el("p", { class: "muted" }, "Looking…"));
    try {
      const r = await api(`/queues/${encodeURIComponent(name)}/requests/${encodeURIComponent(rid)}`);
      const rows = [
        ["State", el("span", { class: "state " + r.state, "data-state": r.state }, r.state.replace("_", " "))],
        ["Request id", el("span", { class: "mono" }, r.rid)],
        r.entry ? ["Entry", el("span", { class: "mono" }, r.entry)] : null,
        r.deadline_ms ? ["Deadline", when(r.deadline_ms)] : null,
        r.consumer ? ["Held by", el("span", {}, el("span", { class: "mono" }, r.consumer), ` · delivery ${r.deliveries} · lease renewed ${dur(r.idle_ms)} ago`)] : null,
        r.waiters && r.waiters.length ? ["Waiting producers", r.waiters.join(", ")] : null,
        r.body_len !== null && r.body_len !== undefined ? ["Body", `${int(r.body_len)} bytes`] : null,
        r.outcome_preview !== null && r.outcome_preview !== undefined ? [r.state === "ok" ? "Response" : "Reason", el("span", { class: "mono" }, r.outcome_preview)] : null,
        r.ttl_ms !== null && r.ttl_ms !== undefined ? ["Kept for", dur(r.ttl_ms)] : null,
      ].filter(Boolean);
      out.replaceChildren(el("dl", { class: "info" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
    } catch (e) {
      out.replaceChildren(el("p", { class: "error-text" }, e.message));
    }
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  async function main() {
    for (;;) {
      try { INFO = await api("/info"); break; } catch (e) {
        status("down", "dashboard unreachable");
        $("app").replaceChildren(el("div", { class: "banner" }, "Cannot reach the dashboard: " + e.message));
        await sleep(2000);
      }
    }
    $("where").textContent = `${INFO.redis} · prefix ${INFO.prefix}` + (INFO.read_only ? " · read-only" : "");
    const m = location.pathname.match(/^\/queues\/([^/]+)\/?$/);
    if (m) await queuePage(decodeURIComponent(m[1]));
    else await overview();
  }

  main();
})();
