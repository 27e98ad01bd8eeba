// The broker page. Everything it shows is set as text (textContent), never
// as HTML, so names, data and attributes cannot inject markup.
"use strict";
(function () {
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const $ = (id) => document.getElementById(id);

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  // pathCell is a cell for a resource path, which may break after a "/"
  // or a "." and nowhere else, so a name is never cut in two.
  function pathCell(tr, text) {
    const td = cell(tr, "", "path");
    td.append(...pathNodes(text));
    return td;
  }

  function pathNodes(text) {
    return text.split(/(?<=[\/.])/).flatMap((part, i) => i ? [document.createElement("wbr"), part] : [part]);
  }

  function age(s) {
    if (!s) return "";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  // setOptions keeps the user's choice when the list is redrawn.
  function setOptions(sel, names) {
    const keep = sel.value;
    if (sel.options.length === names.length && names.every((n, i) => sel.options[i].value === n)) return;
    sel.replaceChildren(...names.map((n) => { const o = document.createElement("option"); o.value = n; o.textContent = n; return o; }));
    if (names.includes(keep)) sel.value = keep;
  }

  // transforms describes a resource's message transforms with their counts.
  function transforms(ts) {
    if (!ts || !ts.length) return "";
    return " · transforms " + ts.map((t) => t.function + (t.disabled ? " (disabled)" : "") +
      " (filtered " + t.filtered + ", failed " + t.failed + ")").join(", ");
  }

  // exported describes a BigQuery or Cloud Storage subscription: where it
  // writes, its state, and what it wrote and failed to.
  function exported(e) {
    const what = e.kind === "bigquery" ? "appends" : "objects";
    return (e.kind === "bigquery" ? "BigQuery " : "Cloud Storage ") + e.destination + " · " + e.state +
      (e.reason ? " (" + e.reason + ")" : "") + " · " + e.messages + " written in " + e.writes + " " + what +
      ", " + e.failed + " refused, " + e.errors + " failed writes";
  }

  function render(state) {
    const body = $("subs").tBodies[0];
    const rows = [];
    const topics = [], subs = [];
    for (const t of state.topics) {
      if (t.name !== "_deleted-topic_") topics.push(t.name);
      const list = t.subscriptions.length ? t.subscriptions : [null];
      for (const s of list) {
        const tr = document.createElement("tr");
        tr.dataset.key = t.name + "\n" + (s ? s.name : "");
        pathCell(tr, t.name + (t.schema ? " (schema " + t.schema + ")" : "") + transforms(t.transforms));
        if (!s) {
          cell(tr, "no subscriptions", "hint");
          for (let i = 0; i < 7; i++) cell(tr, "");
          rows.push(tr);
          continue;
        }
        subs.push(s.name);
        tr.dataset.sub = s.name;
        pathCell(tr, s.name + (s.detached ? " (detached)" : ""));
        cell(tr, String(s.backlog), "num").dataset.field = "backlog";
        cell(tr, String(s.unacked), "num").dataset.field = "unacked";
        cell(tr, age(s.oldestUnackedSeconds), "num");
        cell(tr, String(s.deadLettered), "num");
        cell(tr, String(s.streams), "num");
        cell(tr, (s.export ? exported(s.export) : s.pushEndpoint ? "push to " + s.pushEndpoint : (s.filter ? "filter " + s.filter : "")) + transforms(s.transforms));
        const td = cell(tr, "");
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = "Peek";
        b.className = "peek secondary";
        b.addEventListener("click", () => peek(s.name));
        td.appendChild(b);
        rows.push(tr);
      }
    }
    // The same rows keep their elements and only their text changes: a
    // Peek button replaced by a refresh between the press and the release
    // of a click would lose the click.
    const old = body.rows;
    if (old.length === rows.length && rows.every((tr, i) => old[i].dataset.key === tr.dataset.key)) {
      rows.forEach((tr, i) => {
        for (let j = 0; j < tr.cells.length; j++) {
          const c = old[i].cells[j];
          if (!c.querySelector("button") && c.textContent !== tr.cells[j].textContent) c.replaceChildren(...tr.cells[j].childNodes);
        }
      });
    } else {
      body.replaceChildren(...rows);
    }
    $("empty").hidden = state.topics.length > 0;
    setOptions($("pub-topic"), topics);
    setOptions($("seek-sub"), subs);
  }

  async function call(method, url, form) {
    const opts = { method, headers: { "X-CSRF-Token": token } };
    if (form) opts.body = new URLSearchParams(new FormData(form));
    const r = await fetch(url, opts);
    const v = await r.json().catch(() => ({ error: "unreadable answer (" + r.status + ")" }));
    if (!r.ok) throw new Error(v.error || String(r.status));
    return v;
  }

  async function peek(sub) {
    $("peek-sub").replaceChildren(...pathNodes(sub));
    $("peek-status").textContent = "Peeking…";
    try {
      const v = await call("GET", "/broker/api/peek?n=" + $("peek").dataset.n + "&subscription=" + encodeURIComponent(sub));
      const rows = v.messages.map((m) => {
        const tr = document.createElement("tr");
        cell(tr, m.messageId);
        cell(tr, m.publishTime);
        cell(tr, (m.base64 ? "base64: " : "") + m.data, "data");
        cell(tr, Object.entries(m.attributes || {}).map(([k, x]) => k + "=" + x).join("\n"), "data");
        return tr;
      });
      $("peek").tBodies[0].replaceChildren(...rows);
      $("peek-status").textContent = rows.length ? rows.length + " message(s), none taken" : "Nothing waiting.";
    } catch (e) {
      $("peek-status").textContent = "Peek failed: " + e.message;
    }
  }

  function submit(formId, url, done) {
    const form = $(formId), status = $(formId + "-status");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      status.className = "status";
      status.textContent = "Sending…";
      try {
        status.textContent = done(await call("POST", url, form));
      } catch (e) {
        status.className = "status bad";
        status.textContent = e.message;
      }
      refresh();
    });
  }
  submit("publish", "/broker/api/publish", (v) => "Published, message ID " + v.messageIds.join(", "));
  submit("seek", "/broker/api/seek", (v) => "Sought " + v.subscription);
  // An example a user can edit: an hour ago, to the second, in UTC.
  $("seek-time").placeholder = "e.g. " + new Date(Date.now() - 3600e3).toISOString().replace(/\.\d+Z$/, "Z");

  async function refresh() {
    try {
      const r = await fetch("/broker/api/state", { cache: "no-store" });
      if (!r.ok) throw new Error(String(r.status));
      render(await r.json());
      $("conn").textContent = "Live";
      $("conn").className = "conn ok";
    } catch (e) {
      $("conn").textContent = "Disconnected, retrying…";
      $("conn").className = "conn bad";
    }
  }
  refresh();
  setInterval(refresh, 1000);
})();
