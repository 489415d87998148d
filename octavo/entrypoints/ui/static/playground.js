// The playground: chat (/v1/chat/completions) or raw completion
// (/v1/completions), streamed; per message TTFT, token counts and tokens/s
// (measured here, in the browser); a stop button that aborts the request.
// The conversation and settings stay in this browser (localStorage); the
// API key only in this tab (common.js).
"use strict";

(() => {
  const { $, ApiError, request, withKey, showBanner } = Octavo;
  const CONVERSATION_STORAGE = "octavo.conversation";
  const SETTINGS_STORAGE = "octavo.settings";
  const SETTING_FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "stop", "ignore_eos"];

  let conversation = loadJSON(CONVERSATION_STORAGE, { messages: [] });
  let controller = null; // the running request's AbortController

  function loadJSON(key, fallback) {
    try {
      return JSON.parse(localStorage.getItem(key)) || fallback;
    } catch (ignored) {
      return fallback;
    }
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ------------------------------------------------------------ settings

  function mode() {
    return document.querySelector('input[name="mode"]:checked').value;
  }

  function readSettings() {
    const settings = { mode: mode(), model: $("model").value };
    for (const name of SETTING_FIELDS) settings[name] = $(name).type === "checkbox" ? $(name).checked : $(name).value;
    return settings;
  }

  function saveSettings() {
    localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(readSettings()));
  }

  function restoreSettings() {
    const settings = loadJSON(SETTINGS_STORAGE, {});
    for (const name of SETTING_FIELDS) {
      if (!(name in settings)) continue;
      if ($(name).type === "checkbox") $(name).checked = Boolean(settings[name]);
      else $(name).value = settings[name];
    }
    const radio = document.querySelector(`input[name="mode"][value="${settings.mode === "completion" ? "completion" : "chat"}"]`);
    radio.checked = true;
    return settings;
  }

  function optionalNumber(name) {
    const text = $(name).value.trim();
    return text === "" ? undefined : Number(text);
  }

  // The request's sampling fields; the server validates them (bad values come back as 400s).
  function samplingOptions() {
    const options = {
      temperature: optionalNumber("temperature"),
      top_p: optionalNumber("top_p"),
      max_tokens: optionalNumber("max_tokens"),
      seed: optionalNumber("seed"),
    };
    const stop = $("stop").value.split("\n").filter((line) => line.length > 0);
    if (stop.length) options.stop = stop;
    if ($("ignore_eos").checked) options.ignore_eos = true;
    return options;
  }

  function applyMode() {
    const chat = mode() === "chat";
    $("messages").hidden = !chat;
    $("completion").hidden = chat;
    $("system-label").hidden = !chat;
    $("input").placeholder = chat ? "Message the model (Enter to send)" : "Prompt to continue (Enter to send)";
    $("input").setAttribute("aria-label", chat ? "Message" : "Prompt");
  }

  // ---------------------------------------------------------- statistics

  function statsText(stats) {
    if (!stats) return "";
    const parts = [];
    if (stats.ttft_ms != null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
    if (stats.prompt_tokens != null) parts.push(`${stats.prompt_tokens} prompt tokens`);
    if (stats.completion_tokens != null) parts.push(`${stats.approximate ? "≈" : ""}${stats.completion_tokens} output tokens`);
    if (stats.tokens_per_s != null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
    if (stats.finish_reason) parts.push(stats.finish_reason === "stopped" ? "stopped" : `finish: ${stats.finish_reason}`);
    return parts.join(" · ");
  }

  // Timings of one streamed generation. Output tokens come from the final
  // usage chunk; a stopped stream has none, so its chunks are counted instead.
  class StreamTimer {
    constructor() {
      this.started = performance.now();
      this.first = null;
      this.last = null;
      this.chunks = 0;
      this.usage = null;
      this.finishReason = null;
    }

    onText() {
      const now = performance.now();
      if (this.first === null) this.first = now;
      this.last = now;
      this.chunks += 1;
    }

    stats() {
      const tokens = this.usage ? this.usage.completion_tokens : this.chunks;
      const decodeSeconds = this.first === null ? 0 : (this.last - this.first) / 1000;
      return {
        ttft_ms: this.first === null ? null : this.first - this.started,
        prompt_tokens: this.usage ? this.usage.prompt_tokens : null,
        completion_tokens: tokens,
        approximate: !this.usage,
        // Decode speed: the tokens after the first over the time after the first.
        tokens_per_s: tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null,
        finish_reason: this.finishReason,
      };
    }
  }

  // ------------------------------------------------------------ streaming

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop-button").disabled = !busy;
  }

  // POST body to path and stream it: textOf(choice) -> new text, onText(text, stats) per piece.
  // Resolves to {stats, error}; pressing stop is not an error (finish "stopped").
  async function generate(path, body, textOf, onText) {
    controller = new AbortController();
    const signal = controller.signal;
    setBusy(true);
    const timer = new StreamTimer();
    let error = null;
    try {
      const response = await withKey(() => request(path, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(Object.assign({ stream: true, stream_options: { include_usage: true } }, body)),
        signal,
      }));
      for await (const event of OctavoSSE.events(response)) {
        if (event.error) throw new ApiError(500, event.error.message);
        if (event.usage) timer.usage = event.usage;
        const choice = event.choices && event.choices[0];
        if (!choice) continue;
        const text = textOf(choice);
        if (text) {
          timer.onText();
          onText(text, timer.stats());
        }
        if (choice.finish_reason) timer.finishReason = choice.finish_reason;
      }
    } catch (caught) {
      if (signal.aborted) timer.finishReason = "stopped";
      else error = caught.status ? `Error ${caught.status}: ${caught.message}` : String(caught.message || caught);
    } finally {
      controller = null;
      setBusy(false);
    }
    return { stats: timer.stats(), error };
  }

  function stop() {
    if (controller) controller.abort();
  }

  // ----------------------------------------------------------------- chat

  function fillBody(body, message) {
    if (message.role === "user") body.textContent = message.content;
    else body.replaceChildren(OctavoMarkdown.render(message.content));
    if (message.error) body.appendChild(el("div", "error", message.error));
  }

  function messageView(message) {
    const node = el("div", `message ${message.role}`);
    node.dataset.status = "done";
    const body = el("div", "body");
    const stats = el("div", "stats", statsText(message.stats));
    fillBody(body, message);
    node.append(el("div", "role", message.role === "user" ? "You" : message.model || "Assistant"), body, stats);
    return { node, body, stats };
  }

  function renderConversation() {
    const list = $("messages");
    list.replaceChildren();
    if (!conversation.messages.length) {
      list.appendChild(el("p", "empty", "Send a message to start. The model's answer streams in as it is generated."));
      return [];
    }
    const views = conversation.messages.map(messageView);
    for (const view of views) list.appendChild(view.node);
    list.scrollTop = list.scrollHeight;
    return views;
  }

  function saveConversation() {
    localStorage.setItem(CONVERSATION_STORAGE, JSON.stringify(conversation));
  }

  function chatMessages() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const message of conversation.messages) {
      if (message.content) messages.push({ role: message.role, content: message.content });
    }
    return messages;
  }

  async function sendChat(text) {
    conversation.messages.push({ role: "user", content: text });
    const body = Object.assign({ model: $("model").value, messages: chatMessages() }, samplingOptions());
    const reply = { role: "assistant", content: "", model: $("model").value };
    conversation.messages.push(reply);
    saveConversation();
    const view = renderConversation().pop();
    view.node.dataset.status = "streaming";
    view.body.classList.add("cursor");
    let frame = 0;
    const result = await generate("/v1/chat/completions", body, (choice) => choice.delta && choice.delta.content,
      (piece, stats) => {
        reply.content += piece;
        view.stats.textContent = statsText(stats);
        if (!frame) {
          frame = requestAnimationFrame(() => {
            frame = 0;
            fillBody(view.body, reply);
            $("messages").scrollTop = $("messages").scrollHeight;
          });
        }
      });
    cancelAnimationFrame(frame);
    reply.stats = result.stats;
    if (result.error) reply.error = result.error;
    saveConversation();
    view.body.classList.remove("cursor");
    fillBody(view.body, reply);
    view.stats.textContent = statsText(reply.stats);
    view.node.dataset.status = "done";
  }

  // ------------------------------------------------------- raw completion

  async function sendCompletion(prompt) {
    const output = $("completion-output");
    const generated = el("span", "generated");
    output.replaceChildren(document.createTextNode(prompt), generated);
    output.dataset.status = "streaming";
    const body = Object.assign({ model: $("model").value, prompt }, samplingOptions());
    const result = await generate("/v1/completions", body, (choice) => choice.text, (piece, stats) => {
      generated.textContent += piece;
      $("completion-stats").textContent = statsText(stats);
    });
    if (result.error) output.appendChild(el("div", "error", result.error));
    $("completion-stats").textContent = statsText(result.stats);
    output.dataset.status = "done";
  }

  // ---------------------------------------------------------------- events

  async function send() {
    const text = $("input").value;
    if (!text.trim() || controller) return;
    saveSettings();
    if (mode() === "chat") {
      $("input").value = "";
      await sendChat(text);
    } else {
      await sendCompletion(text);
    }
    $("input").focus();
  }

  function exportConversation() {
    const data = {
      exported_at: new Date().toISOString(),
      server: location.origin,
      settings: readSettings(),
      messages: conversation.messages.map(({ role, content, model, stats, error }) => ({ role, content, model, stats, error })),
    };
    const link = el("a");
    link.href = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" }));
    link.download = `octavo-conversation-${data.exported_at.replace(/[:.]/g, "-")}.json`;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  }

  function newChat() {
    stop();
    conversation = { messages: [] };
    saveConversation();
    renderConversation();
    $("input").focus();
  }

  async function loadModels(preferred) {
    const response = await withKey(() => request("/v1/models"));
    const models = (await response.json()).data;
    const select = $("model");
    select.replaceChildren(...models.map((model) => {
      const option = el("option", "", model.id);
      option.value = model.id;
      return option;
    }));
    if (models.some((model) => model.id === preferred)) select.value = preferred;
  }

  function bindEvents() {
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    $("input").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        send();
      }
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && controller) {
        event.preventDefault();
        stop();
      }
    });
    $("stop-button").addEventListener("click", stop);
    $("new-chat").addEventListener("click", newChat);
    $("export").addEventListener("click", exportConversation);
    for (const radio of document.querySelectorAll('input[name="mode"]')) {
      radio.addEventListener("change", () => {
        applyMode();
        saveSettings();
      });
    }
    for (const name of SETTING_FIELDS) $(name).addEventListener("change", saveSettings);
    $("model").addEventListener("change", saveSettings);
  }

  async function init() {
    Octavo.initChrome();
    const settings = restoreSettings();
    bindEvents();
    applyMode();
    renderConversation();
    try {
      await loadModels(settings.model);
      showBanner("");
    } catch (error) {
      showBanner(error.message);
    }
    $("input").focus();
  }

  init();
})();
