// The xpuspec chat page: conversations in localStorage, replies streamed from /v1/chat/completions
// with stream_options.include_speculation, so each reply knows which of its tokens were accepted drafts.
// It talks to nothing but the server that served it (relative URLs only; the CSP enforces it).
"use strict";

const STORE_KEY = "xpuspec.chat.v1";
const KEY_KEY = "xpuspec.chat.apiKey";
const SETTINGS_KEY = "xpuspec.chat.settings";
// The settings kept across reloads (the system prompt belongs to its conversation).
const SETTINGS = ["temperature", "top_p", "max_tokens", "seed", "drafter", "num_draft_tokens", "draft_tree"];
const EMPTY_HINT =
  "Type a message below: Enter sends it, Shift+Enter starts a new line. The settings on the left are " +
  "kept when you reload; Server defaults restores them. Compare runs a prompt greedy with speculation " +
  "on and off, and accepted drafts are marked in each reply.";
const EXPORT_FORMAT = "xpuspec-chat";

const $ = (id) => document.getElementById(id);
const state = {
  store: loadStore(), defaults: null, defaultValues: {}, controller: null, busy: false, pendingKey: null,
};

// ------------------------------------------------------------------ storage
function loadStore() {
  try {
    const store = JSON.parse(localStorage.getItem(STORE_KEY) || "null");
    if (store && Array.isArray(store.conversations)) return store;
  } catch (error) {
    console.warn("the saved conversations do not parse; starting afresh", error);
  }
  return { conversations: [], current: null };
}

function save() {
  localStorage.setItem(STORE_KEY, JSON.stringify(state.store));
}

const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

function current() {
  const { conversations, current: id } = state.store;
  let conversation = conversations.find((c) => c.id === id);
  if (!conversation) {
    conversation = { id: newId(), title: "New chat", created: Date.now(), messages: [] };
    conversations.unshift(conversation);
    state.store.current = conversation.id;
  }
  return conversation;
}

// Only what differs from the server's defaults is kept: a default the server changes later applies.
function saveSettings() {
  const settings = { show_drafts: $("show-drafts").checked };
  for (const id of SETTINGS) {
    if ($(id).value !== state.defaultValues[id]) settings[id] = $(id).value;
  }
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
}

// The saved settings over the server's defaults; a drafter this server does not offer is left out.
function restoreSettings() {
  let settings = null;
  try {
    settings = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "null");
  } catch (error) {
    console.warn("the saved settings do not parse; using the server's defaults", error);
  }
  if (!settings || typeof settings !== "object") return;
  for (const id of SETTINGS) {
    const value = settings[id];
    if (typeof value !== "string") continue;
    if (id === "drafter" && ![...$("drafter").options].some((option) => option.value === value)) continue;
    $(id).value = value;
  }
  if (typeof settings.show_drafts === "boolean") {
    $("show-drafts").checked = settings.show_drafts;
    document.body.classList.toggle("show-drafts", settings.show_drafts);
  }
}

// ------------------------------------------------------------------ API
function headers() {
  const key = localStorage.getItem(KEY_KEY);
  const out = { "Content-Type": "application/json" };
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) {
    /* not JSON: keep the status line */
  }
  return new ApiError(response.status, message);
}

// Resolves with the key the user entered (the dialog stays until one works or they cancel).
function askForKey(message) {
  const dialog = $("key-dialog");
  $("key-error").textContent = message || "";
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
  return new Promise((resolve) => {
    state.pendingKey = resolve;
  });
}

$("key-save").addEventListener("click", () => {
  const key = $("key-input").value.trim();
  if (!key) return;
  localStorage.setItem(KEY_KEY, key);
  $("key-dialog").close();
  $("key-input").value = "";
  if (state.pendingKey) state.pendingKey(key);
  state.pendingKey = null;
});
$("key-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter") $("key-save").click();
});

// fetch, asking for the API key on a 401 and retrying with it.
async function apiFetch(path, init = {}) {
  for (;;) {
    const response = await fetch(path, { ...init, headers: headers() });
    if (response.status !== 401) return response;
    const error = await errorOf(response);
    const hadKey = Boolean(localStorage.getItem(KEY_KEY));
    await askForKey(hadKey ? `The server refused the key: ${error.message}` : "");
  }
}

async function loadDefaults() {
  const response = await apiFetch("/v1/xpuspec/defaults");
  if (!response.ok) throw await errorOf(response);
  state.defaults = await response.json();
  $("model-name").textContent = state.defaults.model;
  const select = $("drafter");
  select.replaceChildren(
    ...state.defaults.drafters.map((name) => {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name === "auto" ? `auto (${state.defaults.drafter})` : name;
      return option;
    })
  );
  resetParams();
  state.defaultValues = Object.fromEntries(SETTINGS.map((id) => [id, $(id).value]));
  restoreSettings();
}

function resetParams() {
  const d = state.defaults;
  if (!d) return;
  $("temperature").value = d.temperature ?? "";
  $("top_p").value = d.top_p ?? "";
  $("max_tokens").value = d.max_tokens ?? "";
  $("seed").value = d.seed ?? "";
  $("drafter").value = "auto";
  $("num_draft_tokens").value = d.num_draft_tokens ?? "";
  const tree = d.draft_tree;
  $("draft_tree").value = tree == null ? "" : typeof tree === "string" ? tree : `${tree.depth},${tree.width},${tree.nodes}`;
}

function draftTree(text) {
  const value = text.trim().toLowerCase();
  if (!value || value === "chain" || value === "none") return null;
  if (value === "auto") return "auto";
  const parts = value.split(",").map((p) => Number(p.trim()));
  if (parts.length !== 3 || parts.some((n) => !Number.isInteger(n))) {
    throw new Error('draft tree: "chain", "auto" or depth,width,nodes such as 4,2,8');
  }
  return { depth: parts[0], width: parts[1], nodes: parts[2] };
}

function requestBody(messages, overrides = {}) {
  const body = {
    model: state.defaults ? state.defaults.model : "",
    messages,
    stream: true,
    stream_options: { include_usage: true, include_speculation: true },
  };
  // A field left empty is left out: the server gives it the model's default (GET /v1/xpuspec/defaults).
  if ($("temperature").value !== "") body.temperature = Number($("temperature").value);
  if ($("top_p").value !== "") body.top_p = Number($("top_p").value);
  if ($("max_tokens").value) body.max_tokens = Number($("max_tokens").value);
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("drafter").value && $("drafter").value !== "auto") body.drafter = $("drafter").value;
  if ($("num_draft_tokens").value !== "") body.num_draft_tokens = Number($("num_draft_tokens").value);
  const tree = draftTree($("draft_tree").value);
  if (tree !== null) body.draft_tree = tree;
  return Object.assign(body, overrides);
}

// Streams one reply into `reply` ({content, runs, stats}); calls onUpdate as text arrives.
async function streamReply(body, reply, signal, onUpdate) {
  const started = performance.now();
  const response = await apiFetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let firstAt = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(500, chunk.error.message);
        const choice = chunk.choices && chunk.choices[0];
        const content = choice && choice.delta ? choice.delta.content : null;
        if (content && firstAt === null) firstAt = performance.now();
        if (content) reply.content += content;
        if (chunk.xpuspec) {
          reply.runs.push(...chunk.xpuspec.runs);
          if (chunk.xpuspec.speculation) reply.stats = { ...reply.stats, ...chunk.xpuspec.speculation };
        }
        if (choice && choice.finish_reason) reply.finish_reason = choice.finish_reason;
        if (chunk.usage) reply.stats = { ...reply.stats, completion_tokens: chunk.usage.completion_tokens };
        onUpdate();
      }
    }
  }
  const ended = performance.now();
  reply.stats = {
    ...reply.stats,
    wall_s: (ended - started) / 1000,
    client_ttft_s: firstAt === null ? null : (firstAt - started) / 1000,
  };
}

// ------------------------------------------------------------------ rendering
function statsLine(stats) {
  if (!stats) return "";
  const parts = [];
  const tokens = stats.output_tokens ?? stats.completion_tokens;
  if (tokens != null) parts.push(`${tokens} tokens`);
  if (stats.tokens_per_s != null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  const ttft = stats.ttft_s ?? stats.client_ttft_s;
  if (ttft != null) parts.push(`TTFT ${(ttft * 1000).toFixed(0)} ms`);
  if (stats.drafted != null) parts.push(`drafted ${stats.drafted} / accepted ${stats.accepted}`);
  if (stats.accepted_tokens != null) parts.push(`${stats.accepted_tokens} accepted-draft tokens in the reply`);
  if (stats.tokens_per_target_pass != null) parts.push(`${stats.tokens_per_target_pass.toFixed(2)} tokens/target pass`);
  if (stats.drafter) parts.push(`drafter ${stats.drafter}`);
  if (stats.gamma_policy) parts.push(stats.gamma_policy);
  const decisions = decisionsText(stats.drafting_decisions);
  if (decisions) parts.push(decisions);
  if (stats.wall_s != null) parts.push(`${stats.wall_s.toFixed(2)} s`);
  return parts.join(" · ");
}

// What the speculation policy chose, step by step: "steps: prompt lookup 12, off: measured slower 30".
function decisionsText(decisions) {
  if (!decisions) return "";
  const entries = Object.entries(decisions).filter(([, count]) => count > 0);
  if (!entries.length) return "";
  entries.sort((a, b) => b[1] - a[1]);
  return "steps: " + entries.map(([what, count]) => `${what} ${count}`).join(", ");
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

function button(label, title, onClick) {
  const node = element("button", "small", label);
  node.type = "button";
  node.title = title;
  node.addEventListener("click", onClick);
  return node;
}

function renderBody(node, message) {
  if (message.role === "user") node.textContent = message.content;
  else node.innerHTML = Markdown.render(message.content, message.runs);
}

function renderMessage(message, index) {
  const node = element("article", `message ${message.role}`);
  node.dataset.index = index;
  if (message.role === "compare") return renderCompare(node, message);
  const body = element("div", "body");
  renderBody(body, message);
  node.append(body);
  if (message.error) node.append(element("div", "error", message.error));
  if (message.stopped) node.append(element("div", "muted", "stopped"));
  if (message.role === "assistant") {
    node.append(element("div", "stats", statsLine(message.stats)));
    const last = index === current().messages.length - 1;
    if (last) node.append(button("Regenerate", "Answer the last message again", regenerate));
  } else {
    node.append(button("Edit", "Edit this message and send it again", () => editMessage(node, index)));
  }
  return node;
}

function renderCompare(node, message) {
  node.append(element("div", "muted", `Compare (greedy): ${message.prompt}`));
  const columns = element("div", "columns");
  for (const [key, label] of [["on", "speculation on"], ["off", "speculation off"]]) {
    const side = message[key] || { content: "", runs: [] };
    const column = element("div", `column ${key}`);
    column.append(element("h4", null, label));
    const body = element("div", "body");
    body.innerHTML = Markdown.render(side.content, side.runs);
    column.append(body, element("div", "stats", statsLine(side.stats)));
    columns.append(column);
  }
  node.append(columns);
  if (message.on && message.off && message.on.stats && message.off.stats) {
    const same = message.on.content === message.off.content;
    const speedup = message.off.stats.wall_s / message.on.stats.wall_s;
    const verdict = element("div", `verdict ${same ? "same" : "differ"}`);
    const why = same
      ? ""
      : " (the server's default arithmetic is approximate, so a near-tie can break differently: " +
        "`xpuspec serve --exact` gives token-identical greedy text)";
    verdict.textContent = `${same ? "identical" : "different"}${why}`;
    // The speed verdict stands apart from the text's: a loss reads and looks like a loss.
    const faster = speedup >= 1.0;
    const speed = element(
      "div",
      `verdict ${faster ? "faster" : "slower"}`,
      faster
        ? `speculation ${speedup.toFixed(2)}× the speed of the target alone (wall time): faster`
        : `speculation ${speedup.toFixed(2)}× the speed of the target alone (wall time): slower, ` +
          `${((1 - speedup) * 100).toFixed(0)}% lost to drafting`,
    );
    node.append(verdict, speed);
  }
  if (message.error) node.append(element("div", "error", message.error));
  return node;
}

function renderMessages() {
  const list = $("messages");
  const messages = current().messages;
  if (!messages.length) {
    list.replaceChildren(element("p", "empty-hint", EMPTY_HINT));
    return;
  }
  list.replaceChildren(...messages.map(renderMessage));
  list.scrollTop = list.scrollHeight;
}

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren(
    ...state.store.conversations.map((conversation) => {
      const item = element("li", conversation.id === state.store.current ? "active" : "");
      const title = element("span", "title", conversation.title);
      title.addEventListener("click", () => {
        if (state.busy) return;
        state.store.current = conversation.id;
        save();
        renderAll();
      });
      item.append(
        title,
        button("✎", "Rename", () => renameConversation(item, conversation)),
        button("✕", "Delete", () => deleteConversation(conversation))
      );
      return item;
    })
  );
}

function renderAll() {
  current();
  $("system").value = current().system || "";
  renderConversations();
  renderMessages();
}

// Re-render one streaming message at most once per frame.
function liveUpdater(index) {
  let scheduled = false;
  return () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      const node = document.querySelector(`#messages .message[data-index="${index}"]`);
      const message = current().messages[index];
      if (node && message) node.replaceWith(renderMessage(message, index));
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  };
}

// ------------------------------------------------------------------ actions
function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("compare").disabled = busy;
  $("stop").disabled = !busy;
  $("status").textContent = busy ? "generating…" : "";
}

function apiMessages(messages) {
  const system = $("system").value.trim();
  const out = system ? [{ role: "system", content: system }] : [];
  for (const m of messages) if (m.role === "user" || (m.role === "assistant" && m.content)) out.push({ role: m.role, content: m.content });
  return out;
}

async function reply() {
  const conversation = current();
  const history = apiMessages(conversation.messages);
  const message = { role: "assistant", content: "", runs: [], stats: null };
  conversation.messages.push(message);
  const index = conversation.messages.length - 1;
  renderMessages();
  setBusy(true);
  state.controller = new AbortController();
  try {
    await streamReply(requestBody(history), message, state.controller.signal, liveUpdater(index));
  } catch (error) {
    if (error.name === "AbortError") message.stopped = true;
    else message.error = error.message;
  } finally {
    state.controller = null;
    setBusy(false);
    save();
    renderMessages();
  }
}

async function send() {
  const text = $("input").value;
  if (!text.trim() || state.busy) return;
  const conversation = current();
  conversation.system = $("system").value;
  if (!conversation.messages.length) conversation.title = text.trim().slice(0, 40);
  conversation.messages.push({ role: "user", content: text });
  $("input").value = "";
  save();
  renderConversations();
  await reply();
}

async function regenerate() {
  if (state.busy) return;
  const messages = current().messages;
  if (messages.length && messages[messages.length - 1].role === "assistant") messages.pop();
  await reply();
}

function editMessage(node, index) {
  if (state.busy) return;
  const message = current().messages[index];
  const editor = element("textarea", "editor");
  editor.value = message.content;
  const resend = button("Send", "Send the edited message (the replies after it are replaced)", async () => {
    message.content = editor.value;
    current().messages.splice(index + 1);
    save();
    await reply();
  });
  node.replaceChildren(editor, resend, button("Cancel", "Keep the message as it was", renderMessages));
  editor.focus();
}

function renameConversation(item, conversation) {
  const input = element("input", "rename");
  input.value = conversation.title;
  const commit = () => {
    conversation.title = input.value.trim() || conversation.title;
    save();
    renderConversations();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") commit();
    if (event.key === "Escape") renderConversations();
  });
  input.addEventListener("blur", commit);
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function deleteConversation(conversation) {
  if (state.busy) return;
  state.store.conversations = state.store.conversations.filter((c) => c !== conversation);
  if (state.store.current === conversation.id) state.store.current = state.store.conversations[0]?.id ?? null;
  save();
  renderAll();
}

async function compare() {
  const conversation = current();
  const text = $("input").value.trim() || [...conversation.messages].reverse().find((m) => m.role === "user")?.content;
  if (!text || state.busy) return;
  $("input").value = "";
  const history = apiMessages(conversation.messages.filter((m) => m.role !== "compare"));
  if (!history.length || history[history.length - 1].content !== text) history.push({ role: "user", content: text });
  const message = { role: "compare", prompt: text, on: null, off: null };
  conversation.messages.push(message);
  const index = conversation.messages.length - 1;
  renderMessages();
  setBusy(true);
  state.controller = new AbortController();
  try {
    // One after the other, so neither run slows the other down.
    for (const [key, drafter] of [["on", "auto"], ["off", "none"]]) {
      message[key] = { content: "", runs: [], stats: null };
      const body = requestBody(history, { temperature: 0, drafter });
      delete body.seed;
      if (drafter === "none") {
        delete body.draft_tree;
        delete body.num_draft_tokens;
      }
      await streamReply(body, message[key], state.controller.signal, liveUpdater(index));
    }
  } catch (error) {
    message.error = error.name === "AbortError" ? "stopped" : error.message;
  } finally {
    state.controller = null;
    setBusy(false);
    save();
    renderMessages();
  }
}

function exportAll() {
  const data = { format: EXPORT_FORMAT, version: 1, exported: new Date().toISOString(), conversations: state.store.conversations };
  const url = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" }));
  const link = element("a");
  link.href = url;
  link.download = "xpuspec-conversations.json";
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function importFile(file) {
  try {
    const data = JSON.parse(await file.text());
    if (!data || data.format !== EXPORT_FORMAT || !Array.isArray(data.conversations)) {
      throw new Error("not an export of this page");
    }
    const known = new Set(state.store.conversations.map((c) => c.id));
    for (const conversation of data.conversations) {
      if (!conversation || !Array.isArray(conversation.messages)) continue;
      if (known.has(conversation.id)) conversation.id = newId();
      state.store.conversations.push(conversation);
    }
    if (data.conversations.length) state.store.current = data.conversations[0].id;
    save();
    renderAll();
    $("status").textContent = `imported ${data.conversations.length} conversation(s)`;
  } catch (error) {
    $("status").textContent = `import failed: ${error.message}`;
  }
}

// ------------------------------------------------------------------ wiring
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("compare").addEventListener("click", compare);
$("new-chat").addEventListener("click", () => {
  if (state.busy) return;
  state.store.current = null;
  current();
  save();
  renderAll();
});
$("export").addEventListener("click", exportAll);
$("import").addEventListener("change", (event) => {
  if (event.target.files[0]) importFile(event.target.files[0]);
  event.target.value = "";
});
$("reset-params").addEventListener("click", () => {
  resetParams();
  saveSettings();
});
for (const id of [...SETTINGS, "show-drafts"]) {
  $(id).addEventListener("input", saveSettings);
  $(id).addEventListener("change", saveSettings);
}
$("system").addEventListener("change", () => {
  current().system = $("system").value;
  save();
});
$("show-drafts").addEventListener("change", (event) => document.body.classList.toggle("show-drafts", event.target.checked));
$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});

renderAll();
loadDefaults()
  .then(() => {
    document.body.dataset.ready = "true";
  })
  .catch((error) => {
    $("status").textContent = `could not load the server's defaults: ${error.message}`;
  });
