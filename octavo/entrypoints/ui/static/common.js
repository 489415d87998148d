// What both pages share: the API key (kept for this tab only, in
// sessionStorage), calls to the server's API, the key dialog, the message
// banner and the theme switch. Nothing here writes server text as HTML.
"use strict";

const Octavo = (() => {
  const KEY_STORAGE = "octavo.apiKey";
  const THEME_STORAGE = "octavo.theme";

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function apiKey() {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  }

  function $(id) {
    return document.getElementById(id);
  }

  // The server's error object ({"error": {"message"}}) as text, whatever came back.
  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (ignored) {
      // not JSON: fall through
    }
    return response.statusText || "no details";
  }

  // fetch() with the key; a non-2xx answer or an unreachable server throws an ApiError.
  async function request(path, options = {}) {
    const headers = Object.assign({}, options.headers || {});
    const key = apiKey();
    if (key) headers.Authorization = "Bearer " + key;
    let response;
    try {
      response = await fetch(path, Object.assign({}, options, { headers }));
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, `Cannot reach the Octavo server at ${location.origin}: ${error.message}`);
    }
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    return response;
  }

  function showBanner(text) {
    const banner = $("banner");
    banner.textContent = text;
    banner.hidden = !text;
  }

  function element(tag, properties = {}, children = []) {
    const node = Object.assign(document.createElement(tag), properties);
    node.append(...children);
    return node;
  }

  // The key dialog, made on first need (both pages share it).
  function keyDialog() {
    if ($("key-dialog")) return;
    const hint = element("p", { className: "hint" }, [
      "Kept for this tab only (sessionStorage), sent as ",
      element("code", { textContent: "Authorization: Bearer" }), ".",
    ]);
    const form = element("form", { id: "key-form", className: "dialog" }, [
      element("h2", { id: "key-title", textContent: "API key required" }),
      element("p", { id: "key-message" }),
      element("input", { id: "key-input", type: "password", autocomplete: "off", placeholder: "API key" }),
      hint,
      element("div", { className: "buttons" }, [element("button", { className: "primary", type: "submit", textContent: "Use key" })]),
    ]);
    form.setAttribute("role", "dialog");
    form.setAttribute("aria-modal", "true");
    form.setAttribute("aria-labelledby", "key-title");
    form.querySelector("input").setAttribute("aria-label", "API key");
    document.body.appendChild(element("div", { id: "key-dialog", className: "overlay", hidden: true }, [form]));
  }

  let pendingKey = null; // the open dialog's promise: calls refused at once share it

  // Ask for the key in the dialog; resolves once one is entered.
  function askForKey(message) {
    keyDialog();
    $("key-message").textContent = message;
    if (pendingKey) return pendingKey;
    const overlay = $("key-dialog");
    const input = $("key-input");
    overlay.hidden = false;
    input.value = "";
    input.focus();
    pendingKey = new Promise((resolve) => {
      $("key-form").onsubmit = (event) => {
        event.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        sessionStorage.setItem(KEY_STORAGE, key);
        overlay.hidden = true;
        $("key-form").onsubmit = null;
        pendingKey = null;
        resolve();
      };
    });
    return pendingKey;
  }

  function keyRefusedMessage(error) {
    if (!apiKey()) {
      return "This server requires an API key. Enter the key it was started with " +
        "(octavo serve --api-key, or OCTAVO_API_KEY).";
    }
    return `The server refused this API key (401: ${error.message}). Check it and enter it again.`;
  }

  // Run call() until it gets past authentication: a 401 opens the key dialog
  // (with why), and the call is tried again with the new key.
  async function withKey(call) {
    for (;;) {
      try {
        return await call();
      } catch (error) {
        if (!(error instanceof ApiError) || error.status !== 401) throw error;
        await askForKey(keyRefusedMessage(error));
        updateKeyButton();
      }
    }
  }

  function updateKeyButton() {
    $("key-button").hidden = !apiKey();
  }

  function forgetKey() {
    sessionStorage.removeItem(KEY_STORAGE);
    location.reload();
  }

  function currentTheme() {
    const chosen = document.documentElement.dataset.theme;
    if (chosen) return chosen;
    return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function setTheme(theme) {
    document.documentElement.dataset.theme = theme;
    localStorage.setItem(THEME_STORAGE, theme);
    $("theme").textContent = theme === "dark" ? "Light theme" : "Dark theme";
    document.dispatchEvent(new CustomEvent("octavo-theme"));
  }

  // Loaded in <head> without defer, so the saved theme applies before the first paint.
  const savedTheme = localStorage.getItem(THEME_STORAGE);
  if (savedTheme === "light" || savedTheme === "dark") document.documentElement.dataset.theme = savedTheme;

  function initChrome() {
    $("theme").textContent = currentTheme() === "dark" ? "Light theme" : "Dark theme";
    $("theme").addEventListener("click", () => setTheme(currentTheme() === "dark" ? "light" : "dark"));
    $("key-button").addEventListener("click", forgetKey);
    updateKeyButton();
  }

  return { ApiError, $, request, withKey, showBanner, initChrome, apiKey };
})();
