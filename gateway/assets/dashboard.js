// The dashboard's script: one EventSource on dashboard/events, and plain DOM
// and SVG drawing. Everything a client sent (ids, outcomes) is written with
// textContent or setAttribute, never parsed as HTML.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const KEEP = 20000; // attempts kept in memory for the chosen page
  const LOG_ROWS = 300;
  const LABEL_W = 130;
  const PAD_R = 70;
  const FENCE_H = 58;
  const LANE_H = 46;
  const AXIS_H = 24;

  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);

  const state = {
    page: params.get("page"), // null: the server picks the page accessed last
    attempts: [], // the chosen page's, oldest first, with .t (ms) and .grant
    pages: new Map(), // id -> counters
    current: null, // the chosen page's row
    offset: 0, // server clock - browser clock, ms
    windowMs: 60000,
    source: null,
    retry: 1000,
    retryTimer: null,
  };

  // ---- the stream ----

  function connect() {
    if (state.source) state.source.close();
    clearTimeout(state.retryTimer);
    const url = "dashboard/events" + (state.page ? "?page=" + encodeURIComponent(state.page) : "");
    const source = new EventSource(url);
    state.source = source;
    source.addEventListener("snapshot", (ev) => {
      state.retry = 1000;
      setStatus("live", "live");
      onSnapshot(JSON.parse(ev.data));
    });
    source.addEventListener("update", (ev) => onUpdate(JSON.parse(ev.data)));
    source.addEventListener("problem", (ev) => reconnectLater(ev.data));
    source.onerror = () => reconnectLater("connection lost");
  }

  // The server ends a stream after a database error; the browser's own retry
  // would reuse the first URL, so reconnect by hand to the chosen page.
  function reconnectLater(why) {
    if (state.source) state.source.close();
    state.source = null;
    setStatus("connecting", "reconnecting (" + why + ")");
    clearTimeout(state.retryTimer);
    state.retryTimer = setTimeout(connect, state.retry);
    state.retry = Math.min(state.retry * 2, 8000);
  }

  function setStatus(cls, text) {
    const el = $("status");
    el.className = "status " + cls;
    el.textContent = text;
  }

  function clock(now) {
    state.offset = Date.parse(now) - Date.now();
  }

  function onSnapshot(s) {
    clock(s.now);
    $("mode").textContent =
      "this gateway: fencing " + (s.fencing === "enforce" ? "enforced" : "OFF");
    state.pages = new Map(s.pages.map((p) => [p.id, p]));
    state.current = s.page;
    if (s.page) state.page = s.page.id;
    state.attempts = [];
    ingest(s.attempts);
    render();
  }

  function onUpdate(u) {
    clock(u.now);
    for (const p of u.pages) state.pages.set(p.id, p);
    // An update leaves the body out when its version did not change.
    if (u.page) state.current = Object.assign({}, state.current, u.page);
    ingest(u.attempts);
    if (!state.page && state.pages.size > 0) {
      connect(); // the first page appeared: let the server pick it
      return;
    }
    render();
  }

  // A lock grant is inferred at a client's first access with a token it has
  // not used before (each worker edit starts with a fenced GET with its new
  // token): the gateway sees no grant itself.
  function ingest(list) {
    const last = new Map();
    for (const a of state.attempts) last.set(a.client_id, a.token);
    for (const a of list) {
      a.t = Date.parse(a.at);
      a.kind = kindOf(a);
      a.grant = a.token !== null && last.get(a.client_id) !== a.token;
      last.set(a.client_id, a.token);
      state.attempts.push(a);
    }
    if (state.attempts.length > KEEP) state.attempts.splice(0, state.attempts.length - KEEP);
  }

  const red = (a) => a.kind === "refused" || a.kind === "stale" || a.kind === "stale-read";

  function kindOf(a) {
    if (a.outcome === "accepted") return a.method === "PUT" ? "write" : "read";
    if (a.outcome === "stale") return a.method === "PUT" ? "stale" : "stale-read";
    return "refused"; // any other outcome, known today or not
  }

  function choose(id) {
    if (id === state.page) return;
    state.page = id;
    history.replaceState(null, "", "?page=" + encodeURIComponent(id));
    state.attempts = [];
    state.current = null;
    render();
    connect();
  }

  // ---- drawing ----

  // Data changes redraw everything; the clock only moves the timeline.
  let pending = null;
  function render(timelineOnly) {
    const all = timelineOnly !== true;
    if (pending !== null) {
      pending = pending || all;
      return;
    }
    pending = all;
    requestAnimationFrame(() => {
      const everything = pending;
      pending = null;
      if (everything) {
        renderPages();
        renderHead();
        renderLog();
      }
      renderTimeline();
    });
  }

  function el(name, attrs, text) {
    const e = document.createElement(name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function sv(name, attrs, text) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function renderPages() {
    const body = $("pages").tBodies[0];
    const rows = document.createDocumentFragment();
    const ids = [...state.pages.keys()].sort();
    for (const id of ids) {
      const p = state.pages.get(id);
      const tr = el("tr", { "data-page": id });
      if (id === state.page) tr.className = "chosen";
      tr.append(el("td", {}, id));
      tr.append(el("td", { class: "n writes" }, String(p.writes)));
      tr.append(el("td", { class: "n reads" }, String(p.reads)));
      tr.append(el("td", { class: "n refused" + (p.refused ? " some" : "") }, String(p.refused)));
      tr.append(el("td", { class: "n lost" + (p.lost_updates ? " some" : "") }, String(p.lost_updates)));
      tr.addEventListener("click", () => choose(id));
      rows.append(tr);
    }
    body.replaceChildren(rows);
  }

  function renderHead() {
    const cur = state.current;
    $("page-title").textContent = state.page ? "page " + state.page : "no page yet";
    const fence = cur && cur.fence;
    $("fence").textContent = fence ? "fence: " + fence.issuer + " " + fence.token : cur ? "no fence" : "";
    $("version").textContent = cur && cur.body !== null ? "(version " + cur.version + ")" : "";
    // Each edit appends a line: follow the end, unless the reader scrolled up.
    const pre = $("body");
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const text = cur ? (cur.body === null ? "(never written)" : cur.body) : "";
    if (pre.textContent !== text) {
      pre.textContent = text;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
  }

  function hhmmss(t, ms) {
    const d = new Date(t);
    const p = (n, w) => String(n).padStart(w || 2, "0");
    const s = p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
    return ms ? s + "." + p(d.getMilliseconds(), 3) : s;
  }

  function describe(a) {
    return (
      (a.client_id || "(no Client-Id)") + " " + a.method +
      (a.token !== null ? " token " + a.token : " without a token") +
      ": " + a.outcome + " (page version " + a.version +
      (a.fence_token !== null ? ", fence " + a.fence_token : "") + ") at " + hhmmss(a.t, true)
    );
  }

  // Labels in one row of one lane must not overlap: place greedily.
  function labeller() {
    const taken = [];
    return (x, text) => {
      const w = text.length * 6.5 + 6;
      const [a, b] = [x - w / 2, x + w / 2];
      if (taken.some(([c, d]) => a < d && c < b)) return false;
      taken.push([a, b]);
      return true;
    };
  }

  function renderTimeline() {
    const svg = $("timeline");
    const width = Math.max(600, $("timeline-box").clientWidth);
    const all = state.attempts;
    const right = Date.now() + state.offset;
    // The chosen window, or less while the page's history is shorter (a
    // fresh stack fills the width at once).
    const oldest = all.length ? all[0].t - 1000 : -Infinity;
    const left = Math.max(right - state.windowMs, Math.min(oldest, right - 10000));
    const span = right - left;
    const plotW = width - LABEL_W - PAD_R;
    const x = (t) => LABEL_W + ((Math.max(t, left) - left) / span) * plotW;
    // A centred label, moved inside the drawing near its edges.
    const fit = (cx, text) => Math.min(Math.max(cx, LABEL_W + text.length * 3.3), width - 4 - text.length * 3.3);
    let first = all.findIndex((a) => a.t >= left);
    if (first < 0) first = all.length;
    const shown = all.slice(first);

    const lanes = [];
    for (const a of shown) if (!lanes.includes(a.client_id)) lanes.push(a.client_id);
    const height = FENCE_H + Math.max(lanes.length, 1) * LANE_H + AXIS_H;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("height", String(height));
    const g = document.createDocumentFragment();

    // The page's fence over time: a step line, from the value it had when the
    // window opens.
    g.append(sv("text", { x: 8, y: FENCE_H / 2 + 4, class: "lane-label" }, "fence"));
    g.append(sv("line", { x1: LABEL_W, x2: width - 8, y1: FENCE_H - 1, y2: FENCE_H - 1, class: "lane-line" }));
    const before = first > 0 ? all[first - 1] : null;
    const points = [];
    if (before && before.fence_token !== null) points.push([left, before.fence_token]);
    for (const a of shown) if (a.fence_token !== null) points.push([a.t, a.fence_token]);
    if (points.length) {
      const vals = points.map((p) => p[1]);
      const [lo, hi] = [Math.min(...vals), Math.max(...vals)];
      const y = (v) => (hi === lo ? FENCE_H / 2 : FENCE_H - 10 - ((v - lo) / (hi - lo)) * (FENCE_H - 24));
      let d = "";
      let prev = null;
      const fenceLabel = labeller();
      for (const [t, v] of points) {
        d += prev === null ? "M" + x(t) + "," + y(v) : "H" + x(t) + "V" + y(v);
        if (v !== prev && fenceLabel(x(t), String(v))) {
          g.append(sv("text", { x: x(t) + 2, y: y(v) - 4, class: "fence-label" }, String(v)));
        }
        prev = v;
      }
      d += "H" + x(right);
      g.append(sv("path", { d, class: "fence-line" }));
    }

    if (!lanes.length) {
      g.append(sv("text", { x: LABEL_W, y: FENCE_H + LANE_H / 2, class: "empty" },
        state.page ? "no attempts on this page in this window" : "no page yet"));
    }

    lanes.forEach((client, i) => {
      const y = FENCE_H + i * LANE_H + LANE_H / 2;
      const lane = sv("g", { class: "lane", "data-client": client === null ? "" : client });
      lane.append(sv("text", { x: 8, y: y + 4, class: "lane-label" }, client === null ? "(no Client-Id)" : client));
      lane.append(sv("line", { x1: LABEL_W, x2: width - 8, y1: y + LANE_H / 2, y2: y + LANE_H / 2, class: "lane-line" }));

      // A bar over the accesses made with one token: a holder's tenure as
      // the storage saw it (red when one was refused or stale).
      const mine = all.filter((a) => a.client_id === client && a.t >= left - 3600e3);
      const spans = [];
      for (const a of mine) {
        const s = spans[spans.length - 1];
        if (a.token !== null && s && s.token === a.token) {
          s.to = a.t;
          s.refused = s.refused || red(a);
        } else if (a.token !== null) {
          spans.push({ token: a.token, from: a.t, to: a.t, refused: red(a) });
        }
      }
      for (const s of spans) {
        if (s.to < left) continue;
        lane.append(sv("rect", {
          x: x(s.from), y: y - 4, width: Math.max(2, x(s.to) - x(s.from)), height: 8,
          class: "hold" + (s.refused ? " refused" : ""),
        }));
      }

      const above = labeller();
      const below = labeller();
      const mineShown = shown.filter((a) => a.client_id === client);
      // Refusals and lost updates first: their labels win any overlap.
      const loud = mineShown.filter(red);
      const quiet = mineShown.filter((a) => !loud.includes(a));
      for (const a of loud.concat(quiet)) {
        const cx = x(a.t);
        if (a.grant) {
          const m = sv("g", { class: "mark grant", "data-seq": a.seq, "data-token": a.token });
          m.append(sv("title", {}, "lock grant inferred: " + (a.client_id || "(no Client-Id)") + " first used token " + a.token));
          m.append(sv("path", { d: "M" + (cx - 9) + "," + (y - 6) + "l5,6l-5,6l-5,-6z" }));
          const label = "\u25B8" + a.token;
          if (above(cx - 9, label)) m.append(sv("text", { x: cx - 9, y: y - 10, "text-anchor": "middle" }, label));
          lane.append(m);
        }
        const m = sv("g", {
          class: "mark " + a.kind,
          "data-seq": a.seq,
          "data-client": a.client_id === null ? "" : a.client_id,
          "data-method": a.method,
          "data-outcome": a.outcome,
        });
        m.append(sv("title", {}, describe(a)));
        if (a.kind === "read" || a.kind === "stale-read") {
          m.append(sv("circle", { cx, cy: y, r: 4.5 }));
        } else if (a.kind === "write") {
          m.append(sv("rect", { x: cx - 4.5, y: y - 4.5, width: 9, height: 9 }));
        } else if (a.kind === "stale") {
          m.append(sv("rect", { x: cx - 5.5, y: y - 5.5, width: 11, height: 11 }));
        } else {
          m.append(sv("line", { x1: cx - 5, y1: y - 5, x2: cx + 5, y2: y + 5 }));
          m.append(sv("line", { x1: cx - 5, y1: y + 5, x2: cx + 5, y2: y - 5 }));
        }
        if (a.kind !== "read" && a.kind !== "write") {
          const label = a.kind === "stale" ? "stale write: lost update" : a.kind === "stale-read" ? "stale read" : a.outcome;
          const lx = fit(cx, label);
          if (below(lx, label)) m.append(sv("text", { x: lx, y: y + 17, "text-anchor": "middle" }, label));
        }
        lane.append(m);
      }
      g.append(lane);
    });

    // Time axis.
    const axisY = height - AXIS_H;
    const axis = sv("g", { class: "axis" });
    const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600].map((s) => s * 1000);
    const step = steps.find((s) => (s / span) * plotW >= 90) || 600000;
    for (let t = Math.ceil(left / step) * step; t <= right; t += step) {
      axis.append(sv("line", { x1: x(t), x2: x(t), y1: FENCE_H, y2: axisY + 4 }));
      axis.append(sv("text", { x: x(t), y: axisY + 16, "text-anchor": "middle" }, hhmmss(t)));
    }
    g.prepend(axis);
    svg.replaceChildren(g);
  }

  function renderLog() {
    const body = $("log").tBodies[0];
    const rows = document.createDocumentFragment();
    const list = state.attempts;
    for (let i = list.length - 1; i >= Math.max(0, list.length - LOG_ROWS); i--) {
      const a = list[i];
      const tr = el("tr", {
        class: a.kind,
        "data-seq": a.seq,
        "data-client": a.client_id === null ? "" : a.client_id,
        "data-method": a.method,
        "data-outcome": a.outcome,
      });
      tr.append(el("td", {}, hhmmss(a.t, true)));
      tr.append(el("td", {}, a.client_id === null ? "(none)" : a.client_id));
      tr.append(el("td", {}, a.method));
      tr.append(el("td", { class: "n" }, a.token === null ? "" : String(a.token)));
      tr.append(el("td", { class: "outcome" }, a.kind === "stale" ? "stale (lost update)" : a.outcome));
      tr.append(el("td", { class: "n" }, String(a.version)));
      tr.append(el("td", { class: "n" }, a.fence_token === null ? "" : String(a.fence_token)));
      rows.append(tr);
    }
    body.replaceChildren(rows);
  }

  // ---- start ----

  $("window").addEventListener("change", (ev) => {
    state.windowMs = Number(ev.target.value);
    render(true);
  });
  window.addEventListener("resize", () => render(true));
  setInterval(() => render(true), 500); // the window slides with time
  render();
  connect();
})();
