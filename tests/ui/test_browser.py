"""The playground and dashboard in a real browser (headless Chromium), against
``octavo serve`` with the demo model and an API key: the key dialog, a
streamed chat answer with its statistics, stopping a long generation, model
output shown as text, raw completions, the conversation kept and exported,
themes, and the dashboard's charts moving under load. One server and one
browser for the module; ``OCTAVO_UPDATE_SCREENSHOTS=1`` writes the
screenshots to docs/img."""

from __future__ import annotations

import json
import os
import re
import threading

import httpx
import pytest

from tests.entrypoints.server.conftest import read_metrics, wait_for
from tests.entrypoints.server.server_process import ServerProcess

API_KEY = "browser-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT_MS = 60_000
# A small KV cache, so that the dashboard's load fills it (and preempts).
NUM_KV_BLOCKS = 128
# Prompts share a prefix longer than a block, so that the prefix cache hits.
SHARED_PREFIX = "Once upon a time there was a little fox who lived in a quiet forest. Every morning the fox walked"


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory):
    # Depends on `browser` so that a missing browser skips before a server starts.
    args = ["--api-key", API_KEY, "--max-model-len", "512", "--num-kv-blocks", str(NUM_KV_BLOCKS)]
    process = ServerProcess(None, args, tmp_path_factory.mktemp("ui") / "server.log")
    process.wait_healthy()
    yield process
    process.stop()


@pytest.fixture
def page(browser, server):
    """A new tab (so no key yet: sessionStorage is per tab) with localStorage cleared."""
    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server.url + "/ui/static/favicon.svg")  # same origin, no script: clear its storage
    page.evaluate("localStorage.clear()")
    yield page
    page.close()
    assert not errors, f"JavaScript errors: {errors}"


def wait_js(page, expression: str):
    """Poll a JavaScript expression until it is truthy. (Playwright's wait_for_function
    evaluates strings with eval, which the pages' content security policy forbids.)"""
    return wait_for(lambda: page.evaluate(expression), timeout=TIMEOUT_MS / 1000, interval=0.02)


def enter_key(page, key: str = API_KEY) -> None:
    page.wait_for_selector("#key-dialog:not([hidden])")
    page.fill("#key-input", key)
    page.press("#key-input", "Enter")


def open_page(page, server, path: str = "/") -> None:
    page.goto(server.url + path)
    enter_key(page)
    page.wait_for_selector("#key-dialog", state="hidden")
    if path == "/":
        wait_js(page, "document.querySelector('#model').options.length > 0")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")  # the keyboard path


def idle_metrics(server) -> dict[str, float]:
    def idle():
        metrics = read_metrics(server, AUTH)
        return metrics if metrics["octavo:num_requests_running"] == 0 and metrics["octavo:num_inflight_sequences"] == 0 else None

    return wait_for(idle)


def test_a_missing_or_wrong_key_shows_a_clear_message(page, server):
    for path in ("/", "/dashboard"):
        page.goto(server.url + path)
        page.wait_for_selector("#key-dialog:not([hidden])")
        assert "requires an API key" in page.text_content("#key-message")
    enter_key(page, "not-the-key")
    wait_js(page, "document.querySelector('#key-message').textContent.includes('refused')")
    assert "invalid or missing API key" in page.text_content("#key-message")
    enter_key(page)
    page.wait_for_selector("#key-dialog", state="hidden")
    wait_js(page, "document.querySelector('#config').textContent.includes('octavo-demo')")


def test_an_unreachable_server_is_said_so(page, server):
    page.route("**/v1/models", lambda route: route.abort())
    page.goto(server.url + "/")
    page.wait_for_selector("#banner:not([hidden])")
    assert "Cannot reach the Octavo server" in page.text_content("#banner")


def test_chat_streams_the_answer_with_its_statistics(page, server, screenshot_path):
    open_page(page, server)
    page.fill("#temperature", "0")
    send(page, "What does a cow say?")
    page.wait_for_selector(".message.assistant[data-status=done]")
    assert page.text_content(".message.assistant .body") == "A cow says moo."
    stats = page.text_content(".message.assistant .stats")
    assert re.fullmatch(r"TTFT \d+ ms · \d+ prompt tokens · \d+ output tokens · [\d.]+ tok/s · finish: stop", stats), stats
    if os.environ.get("OCTAVO_UPDATE_SCREENSHOTS") == "1":  # a longer conversation for the docs
        for question in ("What color is the sky?", "Tell me a short story about a fox."):
            send(page, question)
            wait_js(page, "[...document.querySelectorAll('.message')].every((m) => m.dataset.status === 'done')")
    page.screenshot(path=str(screenshot_path("playground.png")))

    # Kept in the browser: a reload shows it again (and keeps the key: same tab).
    page.reload()
    page.wait_for_selector(".message.assistant")
    assert page.text_content(".message.assistant .body") == "A cow says moo."  # the first one
    assert page.is_hidden("#key-dialog")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(open(download.value.path()).read())
    assert [m["role"] for m in exported["messages"]][:2] == ["user", "assistant"]
    assert exported["messages"][1]["content"] == "A cow says moo."
    assert exported["messages"][1]["stats"]["finish_reason"] == "stop"
    assert exported["settings"]["temperature"] == "0" and exported["settings"]["model"] == "octavo-demo"


def test_stop_aborts_a_long_generation(page, server):
    before = idle_metrics(server)
    open_page(page, server)
    page.fill("#max_tokens", "480")
    page.check("#ignore_eos")
    send(page, "Tell me a story.")
    body = ".message.assistant .body"
    wait_js(page, f"document.querySelector('{body}').textContent.length > 0")
    first = len(page.text_content(body))
    wait_js(page, f"document.querySelector('{body}').textContent.length > {first}")  # it streams
    page.click("#stop-button")
    page.wait_for_selector(".message.assistant[data-status=done]")
    stats = page.text_content(".message.assistant .stats")
    assert stats.endswith("stopped") and "tok/s" in stats, stats
    after = idle_metrics(server)  # the server's running count is back to 0
    shown = page.text_content(body)
    assert after["octavo:request_success_total{finished_reason=abort}"] == before.get(
        "octavo:request_success_total{finished_reason=abort}", 0) + 1
    assert after["octavo:generation_tokens_total"] - before["octavo:generation_tokens_total"] < 480
    assert page.text_content(body) == shown and page.is_disabled("#stop-button") and page.is_enabled("#send")


def test_model_output_is_shown_as_text(page, server):
    pieces = [
        "<script>window.pwned = 1</script>",
        '<img src=x onerror="window.pwned = 2">\n\n',
        "**bold** and `<b>code</b>`\n\n```html\n<script>alert(3)</script>\n```\n",
        "[bad](javascript:alert(4)) [good](https://example.com/x)",
    ]
    events = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in pieces]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    open_page(page, server)
    page.route("**/v1/chat/completions", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=stream))
    send(page, "Say something dangerous.")
    page.wait_for_selector(".message.assistant[data-status=done]")
    body = page.locator(".message.assistant .body")
    text = body.text_content()
    assert "<script>window.pwned = 1</script>" in text and '<img src=x onerror="window.pwned = 2">' in text
    assert body.locator("script, img, b").count() == 0
    assert body.locator("strong").text_content() == "bold"
    assert body.locator("p code").text_content() == "<b>code</b>"
    assert body.locator("pre code").text_content() == "<script>alert(3)</script>"
    assert [a.get_attribute("href") for a in body.locator("a").all()] == ["https://example.com/x"]
    assert page.evaluate("window.pwned") is None
    # The renderer itself, on crafted text: only its own fixed tags come out.
    tags = page.evaluate("""() => {
        const root = document.createElement('div');
        root.appendChild(OctavoMarkdown.render('# <h1>x</h1>\\n> <iframe src=x>\\n- <svg onload=alert(1)>\\n1. [a](data:text/html,x)'));
        return [...root.querySelectorAll('*')].map((node) => node.tagName.toLowerCase());
    }""")
    assert set(tags) <= {"h3", "blockquote", "p", "ul", "ol", "li"}, tags


def test_raw_completion_mode(page, server):
    open_page(page, server)
    page.check("input[name=mode][value=completion]")
    assert page.is_hidden("#messages") and page.is_visible("#completion")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "8")
    send(page, "Once upon a time")
    page.wait_for_selector("#completion-output[data-status=done]")
    assert page.text_content("#completion-output").startswith("Once upon a time")
    assert page.text_content("#completion-output .generated")
    stats = page.text_content("#completion-stats")
    assert "8 output tokens" in stats and stats.endswith("finish: length"), stats


def test_theme_switch_is_kept(page, server):
    open_page(page, server)
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    theme = page.evaluate("document.documentElement.dataset.theme || ''")
    page.click("#theme")
    switched = page.evaluate("document.documentElement.dataset.theme")
    assert switched in ("light", "dark") and switched != theme
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != background
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == switched


def run_load(url: str, num_requests: int, max_tokens: int) -> threading.Event:
    """Stream that many completions at once, in threads; setting the returned event closes them
    (which aborts them on the server)."""
    stop = threading.Event()

    def one(index: int) -> None:
        prompt = f"{SHARED_PREFIX} to the river number {index}."
        body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0.8}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=120) as response:
            for _ in response.iter_lines():
                if stop.is_set():
                    return

    for index in range(num_requests):
        threading.Thread(target=one, args=(index,), daemon=True).start()
    return stop


def legend_value(label: str) -> str:
    return f"(document.querySelector('.legend li[data-label=\"{label}\"] .value') || {{}}).textContent"


def test_dashboard_charts_move_under_load(page, server, screenshot_path):
    open_page(page, server, "/dashboard")
    page.select_option("#window", "60")
    wait_js(page, "document.querySelector('#config').textContent.includes('torch_paged')")
    wait_js(page, "document.querySelector('#status').textContent.startsWith('Engine running')")
    canvas = "document.querySelector('[data-chart=tokens] canvas').toDataURL()"
    quiet = page.evaluate(canvas)
    for_docs = os.environ.get("OCTAVO_UPDATE_SCREENSHOTS") == "1"  # a longer load: fuller charts
    stop_load = run_load(server.url, num_requests=16 if for_docs else 6, max_tokens=300 if for_docs else 400)
    wait_js(page, f"Number({legend_value('running')}) > 0")
    wait_js(page, f"parseFloat({legend_value('output tokens/s')}) > 0")
    for chart in ("ttft", "itl"):
        wait_js(page, f"!document.querySelector('[data-chart={chart}] .legend .value').textContent.includes('–')")
    assert page.evaluate(canvas) != quiet
    if for_docs:
        page.wait_for_timeout(20_000)
    page.screenshot(path=str(screenshot_path("dashboard.png")), full_page=True)
    stop_load.set()
    idle_metrics(server)


def test_dashboard_shows_each_replica(page, server):
    """Two replicas, as a data-parallel server reports them (the real answer plus a replicas list)."""

    def two_replicas(route):
        sample = route.fetch().json()
        sample["replicas"] = [
            {"num_requests_running": r, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.1 * r,
             "prefix_cache_queries": 10, "prefix_cache_hits": r, "num_preemptions": 0}
            for r in (1, 2)
        ]
        route.fulfill(json=sample)

    page.route("**/ui/api/stats", two_replicas)
    open_page(page, server, "/dashboard")
    wait_js(page, f"{legend_value('replica 1 running')} === '2'")
    labels = page.eval_on_selector_all("[data-chart=kv] .legend li", "items => items.map((i) => i.dataset.label)")
    assert labels == ["used", "replica 0 used", "replica 1 used"]
