// The console's own script: the chat page's stream and the usage chart. Loaded from /ui/static (the
// Content-Security-Policy allows no inline script).
"use strict";

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

function addLine(log, role, text) {
  const item = document.createElement("li");
  item.className = "msg msg-" + role;
  const who = document.createElement("strong");
  who.textContent = role === "user" ? "You: " : "Model: ";
  const body = document.createElement("span");
  body.className = "msg-text";
  body.textContent = text;
  item.append(who, body);
  log.append(item);
  return body;
}

async function showDecision(requestId, target) {
  for (let i = 0; i < 40; i++) {
    const r = await fetch("/ui/chat/decision/" + encodeURIComponent(requestId), { credentials: "same-origin" });
    if (r.status === 200) {
      target.innerHTML = await r.text(); // the console's own autoescaped fragment
      return;
    }
    if (r.status !== 202) {
      target.textContent = "the request's usage row could not be read (HTTP " + r.status + ")";
      return;
    }
    await new Promise((done) => setTimeout(done, 500));
  }
  target.textContent = "the router has not written this request's usage row yet";
}

async function readStream(response, out) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, cut).trim();
      buffered = buffered.slice(cut + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      try {
        const chunk = JSON.parse(data);
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          text += delta.content;
          out.textContent = text;
        }
      } catch (e) {
        // a line that is not JSON is not part of the answer
      }
    }
  }
  return text;
}

function setupChat(form) {
  const log = document.getElementById("chat-log");
  const decision = document.getElementById("chat-decision");
  const history = [];
  // A person's thread: the one the page was opened on (its messages shown again), or the one the first answer
  // starts (its id comes back in x-llmgw-thread).
  let thread = "";
  const kept = document.getElementById("chat-thread");
  if (kept) {
    const seeded = JSON.parse(kept.textContent);
    thread = seeded.id;
    document.getElementById("chat-model").value = seeded.model;
    for (const m of seeded.messages) {
      history.push(m);
      addLine(log, m.role, m.content).parentElement.dataset.done = "1";
    }
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = document.getElementById("chat-input");
    const key = document.getElementById("chat-key");
    const content = input.value.trim();
    if (!content) return;
    history.push({ role: "user", content: content });
    addLine(log, "user", content);
    input.value = "";
    const out = addLine(log, "assistant", "");
    out.parentElement.setAttribute("aria-busy", "true");
    const body = { model: document.getElementById("chat-model").value, messages: history };
    if (key) body.key = key.value;
    if (thread) body.thread = thread;
    const response = await fetch("/ui/chat/send", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
      body: JSON.stringify(body),
    });
    if (response.status !== 200) {
      let message = "HTTP " + response.status;
      try {
        message = (await response.json()).error.message;
      } catch (e) {
        // not the JSON error shape
      }
      out.textContent = "refused: " + message;
      out.parentElement.classList.add("msg-error");
      out.parentElement.removeAttribute("aria-busy");
      history.pop();
      return;
    }
    const requestId = response.headers.get("x-request-id");
    thread = response.headers.get("x-llmgw-thread") || thread;
    const text = await readStream(response, out);
    out.parentElement.removeAttribute("aria-busy");
    out.parentElement.dataset.done = "1";
    history.push({ role: "assistant", content: text });
    if (requestId) showDecision(requestId, decision);
  });
}

function drawUsage(holder, data, by, measure) {
  holder.replaceChildren();
  if (typeof uPlot === "undefined" || !data.x.length) return;
  const palette = ["#1f5fa8", "#b3261e", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f"];
  const groups = data.groups[by] || {};
  const names = Object.keys(groups).sort();
  const columns = [data.x].concat(names.map((n) => groups[n][measure]));
  const series = [{}].concat(
    names.map((n, i) => ({ label: n, stroke: palette[i % palette.length], width: 2 }))
  );
  const width = Math.max(320, holder.clientWidth || 640);
  const opts = { width: width, height: 220, series: series, axes: [{}, { label: measure }] };
  new uPlot(opts, columns, holder);
}

function setupUsage(holder, data) {
  const by = document.getElementById("chart-by");
  const measure = document.getElementById("chart-measure");
  const caption = document.getElementById("chart-caption");
  const redraw = () => {
    const what = measure.value.charAt(0).toUpperCase() + measure.value.slice(1);
    caption.textContent = what + " per hour by " + by.value;
    drawUsage(holder, data, by.value, measure.value);
  };
  by.addEventListener("change", redraw);
  measure.addEventListener("change", redraw);
  redraw();
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("chat-form");
  if (form) setupChat(form);
  const data = document.getElementById("usage-data");
  const holder = document.getElementById("usage-chart");
  if (data && holder) setupUsage(holder, JSON.parse(data.textContent));
});
