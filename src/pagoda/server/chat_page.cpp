#include "pagoda/server/chat_page.h"

namespace pagoda::server {

// Kept as one raw string so the binary serves it with no files beside it. The browser test
// (tests/server/browser_test.py) relies on #prompt, #send, #messages, and on each reply being a
// `.message.assistant` whose data-state is "streaming" until the stream ends, then "done".
std::string_view chat_page_html() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pagoda</title>
<style>
  :root { --fg: #1d1d1f; --muted: #6e6e73; --line: #d2d2d7; --user: #e8f0fe; --accent: #8b2e16; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; color: var(--fg); display: flex;
         flex-direction: column; height: 100vh; }
  header { display: flex; gap: 1rem; align-items: baseline; padding: .6rem 1rem;
           border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 1.1rem; margin: 0; color: var(--accent); }
  header label { color: var(--muted); font-size: .85rem; }
  header input { width: 5rem; }
  #messages { flex: 1; overflow-y: auto; padding: 1rem; display: flex; flex-direction: column; gap: .75rem; }
  .message { max-width: 48rem; padding: .5rem .8rem; border-radius: .6rem; white-space: pre-wrap;
             overflow-wrap: anywhere; }
  .message.user { align-self: flex-end; background: var(--user); }
  .message.assistant { align-self: flex-start; border: 1px solid var(--line); }
  .message.assistant[data-state="streaming"]::after { content: "▍"; color: var(--muted); }
  .message.error { align-self: flex-start; color: #b00020; border: 1px solid #b00020; }
  .stats { font-size: .8rem; color: var(--muted); align-self: flex-start; margin-top: -.5rem; }
  form { display: flex; gap: .5rem; padding: .75rem 1rem; border-top: 1px solid var(--line); }
  #prompt { flex: 1; resize: none; font: inherit; padding: .5rem; height: 3.2rem; }
  button { font: inherit; padding: 0 1.2rem; }
</style>
</head>
<body>
<header>
  <h1>pagoda</h1>
  <span id="model"></span>
  <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="max-tokens" type="number" min="1" value="256"></label>
  <label>API key <input id="api-key" type="password" placeholder="none"></label>
  <button id="reset" type="button">New chat</button>
</header>
<div id="messages"></div>
<form id="form">
  <textarea id="prompt" placeholder="Message (Enter sends, Shift+Enter is a new line)" autofocus></textarea>
  <button id="send" type="submit">Send</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
let model = null;
let controller = null;  // aborts the reply in flight (the server then cancels it)

$("api-key").value = localStorage.getItem("pagoda-api-key") || "";
$("api-key").addEventListener("change", () => localStorage.setItem("pagoda-api-key", $("api-key").value));

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("api-key").value) h["Authorization"] = "Bearer " + $("api-key").value;
  return h;
}

function add(kind, text) {
  const div = document.createElement("div");
  div.className = "message " + kind;
  div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

async function loadModel() {
  const response = await fetch("/v1/models", { headers: headers() });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  model = body.data[0].id;
  $("model").textContent = model;
}

// Reads server-sent events from a fetch response; calls onData with each parsed "data:" JSON.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  add("user", text);
  const reply = add("assistant", "");
  reply.dataset.state = "streaming";
  $("send").textContent = "Stop";
  controller = new AbortController();
  const started = performance.now();
  let firstToken = 0;
  try {
    if (!model) await loadModel();
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        model, messages: history, stream: true, stream_options: { include_usage: true },
        temperature: Number($("temperature").value), max_tokens: Number($("max-tokens").value),
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error ? body.error.message : response.statusText);
    }
    let usage = null;
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices.length ? chunk.choices[0].delta : null;
      if (delta && delta.content) {
        if (!firstToken) firstToken = performance.now();
        reply.textContent += delta.content;
        reply.scrollIntoView({ block: "end" });
      }
    });
    history.push({ role: "assistant", content: reply.textContent });
    if (usage && firstToken) {
      const seconds = (performance.now() - firstToken) / 1000;
      const rate = usage.completion_tokens > 1 && seconds > 0 ? ((usage.completion_tokens - 1) / seconds).toFixed(1) : "-";
      add("stats", `${usage.prompt_tokens} prompt tokens, ${usage.completion_tokens} generated, ` +
          `first token after ${((firstToken - started) / 1000).toFixed(2)} s, ${rate} tokens/s`);
    }
  } catch (error) {
    if (error.name !== "AbortError") add("error", String(error.message || error));
    history.pop();  // the turn did not complete: do not send it again
  } finally {
    reply.dataset.state = "done";
    $("send").textContent = "Send";
    controller = null;
  }
}

$("form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (controller) { controller.abort(); return; }
  const text = $("prompt").value.trim();
  if (!text) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("form").requestSubmit(); }
});
$("reset").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  $("messages").replaceChildren();
});
loadModel().catch((error) => add("error", "cannot list models: " + error.message));
</script>
</body>
</html>
)html";
}

}  // namespace pagoda::server
