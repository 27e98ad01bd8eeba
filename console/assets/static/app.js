// The console page: publishes through the form, redelivers on request, and
// renders the live view from server-sent events. Everything shown goes in
// through textContent, never as HTML.
"use strict";

(function () {
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const form = document.getElementById("publish");
  const send = document.getElementById("send");
  const formStatus = document.getElementById("form-status");
  const redeliverStatus = document.getElementById("redeliver-status");
  const rows = document.getElementById("rows");
  const empty = document.getElementById("empty");
  const conn = document.getElementById("conn");
  const maxRows = 200;

  function post(path, params) {
    return fetch(path, {
      method: "POST",
      headers: { "X-CSRF-Token": token, "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(params),
      credentials: "same-origin",
    }).then(async (res) => {
      let body = {};
      try { body = await res.json(); } catch (e) { body = { error: "unexpected answer (HTTP " + res.status + ")" }; }
      if (!res.ok) {
        const err = new Error(body.error || "HTTP " + res.status);
        err.field = body.field || "";
        throw err;
      }
      return body;
    });
  }

  function setStatus(el, text, isError) {
    el.textContent = text;
    el.classList.toggle("bad", !!isError);
  }

  function clearFieldErrors() {
    for (const name of ["message", "key", "copies"]) {
      const input = document.getElementById(name);
      const err = document.getElementById(name + "-err");
      input.removeAttribute("aria-invalid");
      err.hidden = true;
      err.textContent = "";
    }
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    clearFieldErrors();
    setStatus(formStatus, "Publishing…", false);
    send.disabled = true;
    const data = new FormData(form);
    post("/api/publish", data)
      .then((r) => {
        const n = r.message_ids.length;
        const ids = r.message_ids.join(", ");
        setStatus(formStatus, (n === 1 ? "Published to the input, message ID " : "Published " + n + " copies to the input, message IDs ") + ids + ".", false);
        document.getElementById("message").select();
      })
      .catch((err) => {
        if (err.field) {
          const input = document.getElementById(err.field);
          const box = document.getElementById(err.field + "-err");
          input.setAttribute("aria-invalid", "true");
          box.textContent = err.message;
          box.hidden = false;
          input.focus();
          setStatus(formStatus, "Not published: see " + err.field + ".", true);
        } else {
          setStatus(formStatus, "Not published: " + err.message, true);
        }
      })
      .finally(() => { send.disabled = false; });
  });

  function redeliver(submission, label) {
    setStatus(redeliverStatus, "Seeking the pipeline's subscription back…", false);
    post("/api/redeliver", { submission: String(submission) })
      .then((r) => {
        const more = r.replayed - r.message_ids.length;
        let text = "Redelivering “" + label + "” (input message ID " + r.message_ids.join(", ") + ")";
        if (more > 0) text += " and " + more + " message" + (more === 1 ? "" : "s") + " published after it";
        setStatus(redeliverStatus, text + ": same message IDs again, so the pipeline drops them. Watch the counters.", false);
      })
      .catch((err) => setStatus(redeliverStatus, "Redelivery failed: " + err.message, true));
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function addRow(r) {
    const tr = document.createElement("tr");
    tr.dataset.seq = r.seq;
    cell(tr, r.data, r.binary ? "data binary" : "data");
    const key = cell(tr, r.key, "key");
    if (r.key_from_id) {
      key.textContent = "";
      const em = document.createElement("em");
      em.textContent = "none";
      em.title = "published without a key: the pipeline used the message ID " + r.key;
      key.appendChild(em);
    }
    cell(tr, r.message_id, "id");
    const time = document.createElement("time");
    time.dateTime = r.event_time;
    time.textContent = r.event_time.replace("T", " ").replace("Z", " UTC");
    if (r.event_time_from !== "attribute") time.title = "no event time attribute: this is the output's publish time";
    cell(tr, "", "time").appendChild(time);
    const act = cell(tr, "", "act");
    if (r.submission) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "secondary";
      b.textContent = "Redeliver";
      b.setAttribute("aria-label", "Redeliver " + r.data);
      b.addEventListener("click", () => redeliver(r.submission, r.data));
      act.appendChild(b);
    }
    rows.insertBefore(tr, rows.firstChild);
    while (rows.children.length > maxRows) rows.removeChild(rows.lastChild);
    empty.hidden = true;
  }

  function setCounts(c) {
    for (const el of document.querySelectorAll("[data-count]")) {
      const v = c[el.dataset.count];
      if (v !== undefined && el.textContent !== String(v)) {
        el.textContent = String(v);
        // Only counters flash: the advice line changes every second.
        if (typeof v !== "number") continue;
        el.classList.remove("bump");
        void el.offsetWidth; // restart the highlight
        el.classList.add("bump");
      }
    }
  }

  // EventSource reconnects by itself and sends Last-Event-ID, so the
  // server resumes after the last row this page has.
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => { conn.textContent = "Live"; conn.className = "conn ok"; });
  es.addEventListener("error", () => { conn.textContent = "Disconnected, retrying…"; conn.className = "conn bad"; });
  es.addEventListener("row", (ev) => addRow(JSON.parse(ev.data)));
  es.addEventListener("counts", (ev) => setCounts(JSON.parse(ev.data)));
  // The console restarted: its rows and page token are new.
  es.addEventListener("reset", () => { es.close(); location.reload(); });
})();
