"""The chat page at / in a real browser (Debian's headless Chromium driven by Playwright) against a real
`xpuspec serve` on the demo bundle: streaming, Stop cancelling on the server, accepted drafts marked,
compare, persistence, export/import, the API-key prompt, and nothing fetched from elsewhere.

The tests of one module share one page and run in order (a conversation made by one is reloaded,
exported and imported by the next ones).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.server.conftest import LiveServer, start_server, stop_server, wait_until
from xpuspec.sample.defaults import DEFAULT_MAX_TOKENS
from xpuspec.server import ServerConfig, create_app, server_state

CHROMIUM = os.environ.get("XPUSPEC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Where the README's screenshot is refreshed from, when set (tests otherwise write to tmp_path).
SCREENSHOT_ENV = "XPUSPEC_CHAT_SCREENSHOT"
TIMEOUT_MS = 60_000
PROMPT = "Write a short Python function that adds two numbers."


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the browser tests need playwright (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM}: apt-get install chromium (.ci/run installs it when missing)"
    return None


# ------------------------------------------------------------------ the routes, in-process


def test_the_page_and_its_files_are_served_under_a_same_origin_policy(client: FlaskClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
    html = page.get_data(as_text=True)
    # Every file the page names is the server's own, and is there.
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        if url.startswith("data:"):
            continue
        assert url.startswith("/chat/"), url
        assert client.get(url).status_code == 200, url
    assert client.get("/chat/chat.js").mimetype in ("text/javascript", "application/javascript")
    assert client.get("/chat/../chat_page.py").status_code == 404
    assert client.get("/chat/nothing.js").status_code == 404


def test_defaults_name_the_server_drafter_and_the_request_defaults(
    client: FlaskClient, served_app: Flask
) -> None:
    defaults = client.get("/v1/xpuspec/defaults").get_json()
    assert defaults["model"] == server_state(served_app).config.served_model_name
    assert defaults["drafter"] == "draft" and defaults["drafters"] == ["auto", "draft", "none"]
    # The model's own: what every route gives a request that leaves them out, with their sources.
    expected = server_state(served_app).loop.requests.bundle.sampling_defaults
    for name, value in expected.as_dict().items():
        assert defaults[name] == value, name
        assert defaults["sources"][name] == expected.source(name)
    assert defaults["max_tokens"] == DEFAULT_MAX_TOKENS and defaults["seed"] is None
    assert defaults["ready"] is True and defaults["max_model_len"] == 128


def test_with_an_api_key_the_page_is_open_and_its_api_calls_are_not() -> None:
    release = threading.Event()

    def never_loads():  # type: ignore[no-untyped-def]
        release.wait(60)
        raise RuntimeError("test model")

    app = create_app(never_loads, ServerConfig(served_model_name="m", api_key="sekret"))
    try:
        client = app.test_client()
        assert client.get("/").status_code == 200
        assert client.get("/chat/chat.js").status_code == 200
        assert client.get("/v1/xpuspec/defaults").status_code == 401
        assert (
            client.get("/v1/xpuspec/defaults", headers={"Authorization": "Bearer sekret"}).status_code == 200
        )
    finally:
        release.set()


# ------------------------------------------------------------------ in the browser


class Recorder:
    """Every request the page makes and every console error it logs."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.errors: list[str] = []

    def attach(self, page: Any) -> None:
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def foreign(self, origin: str) -> list[str]:
        # blob: is the export's own download (in memory); data: the empty favicon.
        return [url for url in self.urls if not url.startswith((origin + "/", "blob:", "data:"))]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = browser_missing()
    if missing is not None:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def page(browser: Any, demo_live_server: LiveServer, recorder: Recorder) -> Iterator[Any]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    recorder.attach(page)
    open_page(page, demo_live_server)
    yield page
    context.close()


def open_page(page: Any, server: LiveServer) -> None:
    page.goto(server.base_url + "/")
    page.wait_for_selector("body[data-ready=true]")


def set_field(page: Any, field: str, value: str) -> None:
    page.fill(f"#{field}", value)


def wait_idle(page: Any) -> None:
    page.wait_for_selector("#send:not([disabled])")


def stored_messages(page: Any) -> list[dict[str, Any]]:
    store = json.loads(page.evaluate("localStorage.getItem('xpuspec.chat.v1')"))
    conversation = next(c for c in store["conversations"] if c["id"] == store["current"])
    return conversation["messages"]


def marked_tokens(page: Any, selector: str) -> int:
    """Tokens the page marks as accepted drafts in ``selector``: each run once, however many pieces
    the markup cut it into."""
    return int(
        page.evaluate(
            """(selector) => {
                const runs = new Map();
                for (const node of document.querySelectorAll(selector + ' .draft'))
                    runs.set(node.dataset.run, Number(node.dataset.tokens));
                return [...runs.values()].reduce((a, b) => a + b, 0);
            }""",
            selector,
        )
    )


def cancelled_count(server: LiveServer) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    match = re.search(r"^xpuspec_requests_cancelled_total (\S+)$", text, re.MULTILINE)
    assert match, "no xpuspec_requests_cancelled_total in /metrics"
    return float(match.group(1))


@pytest.mark.slow
def test_an_empty_chat_hints_and_the_settings_survive_a_reload(
    page: Any, demo_live_server: LiveServer
) -> None:
    hint = page.text_content("#messages .empty-hint")
    assert hint is not None and "Enter sends it" in hint
    defaults = {field: page.input_value(f"#{field}") for field in ("temperature", "max_tokens", "seed")}
    set_field(page, "temperature", "0.3")
    set_field(page, "max_tokens", "77")
    set_field(page, "seed", "5")
    page.select_option("#drafter", "none")
    page.uncheck("#show-drafts")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    kept = {
        field: page.input_value(f"#{field}") for field in ("temperature", "max_tokens", "seed", "drafter")
    }
    assert kept == {"temperature": "0.3", "max_tokens": "77", "seed": "5", "drafter": "none"}
    assert not page.is_checked("#show-drafts") and "show-drafts" not in page.get_attribute("body", "class")
    page.click("#reset-params")
    page.check("#show-drafts")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert {field: page.input_value(f"#{field}") for field in defaults} == defaults
    assert page.input_value("#drafter") == "auto" and page.is_checked("#show-drafts")


@pytest.mark.slow
def test_a_reply_streams_in_and_its_accepted_drafts_are_marked(
    page: Any, demo_live_server: LiveServer, tmp_path: Path
) -> None:
    assert page.input_value("#drafter") == "auto"  # initialised from /v1/xpuspec/defaults
    set_field(page, "temperature", "0")
    set_field(page, "max_tokens", "120")
    # A fixed γ drafts at every step; an adaptive one may, on a busy machine, choose not to.
    set_field(page, "num_draft_tokens", "4")
    # Every length the reply's text has on screen, as the page redraws it.
    page.evaluate(
        """() => {
            window.lengths = [];
            new MutationObserver(() => {
                const body = document.querySelector('#messages .assistant:last-of-type .body');
                if (body) window.lengths.push(body.textContent.length);
            }).observe(document.querySelector('#messages'), {subtree: true, childList: true});
        }"""
    )
    page.click("#input")
    page.keyboard.type("First line")
    page.keyboard.press("Shift+Enter")  # a new line, not a send
    page.keyboard.type(PROMPT)
    assert page.input_value("#input") == "First line\n" + PROMPT
    page.keyboard.press("Enter")
    wait_idle(page)
    lengths = [length for length in page.evaluate("window.lengths") if length > 0]
    assert len(set(lengths)) >= 2 and lengths == sorted(lengths), "the reply did not grow while streaming"

    user, reply = stored_messages(page)
    assert user["content"] == "First line\n" + PROMPT
    assert reply["content"] and not reply.get("error")
    accepted = reply["stats"]["accepted_tokens"]
    assert accepted > 0, "the draft model's drafts were never accepted"
    assert marked_tokens(page, "#messages .assistant") == accepted
    stats = page.text_content("#messages .assistant .stats")
    for figure in ("tok/s", "TTFT", "drafted", "tokens/target pass", "drafter draft", "fixed γ=4"):
        assert figure in stats, stats
    assert f"{accepted} accepted-draft tokens" in stats

    # The toggle hides the marking; the legend stays.
    page.uncheck("#show-drafts")
    assert page.evaluate("getComputedStyle(document.querySelector('.draft')).backgroundColor") in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    page.check("#show-drafts")
    assert "accepted draft" in page.text_content("header .legend")

    screenshot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "chat-page.png")
    page.screenshot(path=str(screenshot))
    assert screenshot.stat().st_size > 10_000


@pytest.mark.slow
def test_stop_ends_the_reply_and_the_server_cancels_the_request(
    page: Any, demo_live_server: LiveServer
) -> None:
    before = cancelled_count(demo_live_server)

    # A reply that cannot end by itself soon: no end-of-sequence, the whole context to fill.
    def no_eos(route: Any) -> None:
        body = json.loads(route.request.post_data)
        route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))

    page.route("**/v1/chat/completions", no_eos)
    set_field(page, "max_tokens", "")
    set_field(page, "input", "Count to one thousand.")
    page.click("#send")
    # A function, not a string: the page's CSP forbids evaluating strings.
    page.wait_for_function(
        "() => document.querySelector('#messages .assistant:last-of-type .body')?.textContent.length > 0"
    )
    page.click("#stop")
    wait_idle(page)
    page.unroute("**/v1/chat/completions")
    assert stored_messages(page)[-1].get("stopped") is True
    assert page.is_visible("#messages .assistant:last-of-type >> text=stopped")
    assert wait_until(lambda: cancelled_count(demo_live_server) >= before + 1, timeout=15)
    assert wait_until(lambda: demo_live_server.state()["num_in_flight"] == 0, timeout=15)


@pytest.mark.slow
def test_regenerate_and_edit_and_resend(page: Any) -> None:
    set_field(page, "max_tokens", "24")
    page.click("#messages .assistant:last-of-type >> text=Regenerate")
    wait_idle(page)
    messages = stored_messages(page)
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] and not messages[-1].get("stopped")

    count = len(messages)
    last_user = page.locator("#messages .user").last
    last_user.get_by_text("Edit").click()
    last_user.locator("textarea").fill("Say hello.")
    last_user.get_by_text("Send").click()
    wait_idle(page)
    messages = stored_messages(page)
    assert len(messages) == count and messages[-2]["content"] == "Say hello." and messages[-1]["content"]


@pytest.mark.slow
def test_compare_shows_two_identical_greedy_answers(page: Any) -> None:
    set_field(page, "max_tokens", "48")
    set_field(page, "num_draft_tokens", "4")  # the run without speculation leaves it out
    set_field(page, "input", PROMPT)
    page.click("#compare")
    page.wait_for_selector("#messages .compare .verdict")
    on = page.text_content("#messages .compare .column.on .body")
    off = page.text_content("#messages .compare .column.off .body")
    assert on and on == off
    assert "identical" in page.text_content("#messages .compare .verdict")
    assert marked_tokens(page, "#messages .compare .column.on") > 0
    assert marked_tokens(page, "#messages .compare .column.off") == 0
    assert "drafter none" in page.text_content("#messages .compare .column.off .stats")


@pytest.mark.slow
def test_a_reload_keeps_the_conversation_and_a_rename(page: Any, demo_live_server: LiveServer) -> None:
    before = page.inner_text("#messages")
    page.click("#conversations li.active >> text=✎")
    page.fill("#conversations .rename", "Renamed chat")
    page.keyboard.press("Enter")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.inner_text("#messages") == before
    assert page.text_content("#conversations li.active .title") == "Renamed chat"


@pytest.mark.slow
def test_export_then_import_restores_the_conversations(page: Any, tmp_path: Path) -> None:
    messages = stored_messages(page)
    with page.expect_download() as download:
        page.click("#export")
    path = tmp_path / "export.json"
    download.value.save_as(path)
    exported = json.loads(path.read_text())
    assert exported["format"] == "xpuspec-chat"
    assert [c["messages"] for c in exported["conversations"] if c["title"] == "Renamed chat"] == [messages]

    while (
        page.locator("#conversations li").count()
        and page.text_content("#conversations li .title") != "New chat"
    ):
        page.click("#conversations li >> nth=0 >> text=✕")
    assert page.inner_text("#messages").startswith("Type a message below")  # the empty state's hint
    page.set_input_files("#import", str(path))
    page.wait_for_selector("#conversations li.active >> text=Renamed chat")
    assert stored_messages(page) == messages


@pytest.mark.slow
def test_markdown_renders_code_escapes_html_and_marks_the_drafts_characters(page: Any) -> None:
    source = (
        "# Title\n\nSome **bold**, `code` and <b>raw</b>\n\n```python\ndef f():\n    return 1  # one\n```\n"
    )
    drafted = "# Title\n\nSome **bo"  # the first run: accepted drafts, across the markup
    runs = [
        {"text": drafted, "tokens": 6, "accepted_draft": True},
        {"text": source[len(drafted) :], "tokens": 20, "accepted_draft": False},
    ]
    rendered = page.evaluate(
        """([source, runs]) => {
            const box = document.createElement('div');
            box.innerHTML = Markdown.render(source, runs);
            return {
                html: box.innerHTML,
                drafts: [...box.querySelectorAll('.draft')].map((n) => n.textContent).join(''),
                tags: [...box.querySelectorAll('h1, strong, code, pre, b, script')].map((n) => n.tagName),
                keywords: [...box.querySelectorAll('.hl-kw')].map((n) => n.textContent),
                comments: [...box.querySelectorAll('.hl-com')].map((n) => n.textContent),
            };
        }""",
        [source, runs],
    )
    assert rendered["tags"] == ["H1", "STRONG", "CODE", "PRE", "CODE"]  # no <b>: raw HTML stays text
    assert "&lt;b&gt;raw&lt;/b&gt;" in rendered["html"]
    assert rendered["drafts"] == "TitleSome bo"  # the drafts' characters that show (not the markup)
    assert rendered["keywords"] == ["def", "return"] and rendered["comments"] == ["# one"]


@pytest.mark.slow
def test_the_page_logged_no_error_and_fetched_only_from_its_server(
    page: Any, recorder: Recorder, demo_live_server: LiveServer
) -> None:
    assert recorder.urls, "no request was recorded"
    assert not recorder.foreign(demo_live_server.base_url)
    assert not recorder.errors


@pytest.mark.slow
def test_the_api_key_prompt_works_and_a_wrong_key_is_refused(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from xpuspec.models.demo import demo_bundle_path

    server = start_server(
        demo_bundle_path(), tmp_path_factory.mktemp("keyed") / "server.log", "--api-key", "s3cret"
    )
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        recorder = Recorder()
        recorder.attach(page)
        page.goto(server.base_url + "/")  # the page itself needs no key
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "wrong")
        page.click("#key-save")
        page.wait_for_selector("#key-dialog[open] #key-error:has-text('invalid API key')")
        page.fill("#key-input", "s3cret")
        page.click("#key-save")
        page.wait_for_selector("body[data-ready=true]")
        assert not page.is_visible("#key-dialog")
        set_field(page, "temperature", "0")  # greedy: a sampled end-of-sequence could leave no text
        set_field(page, "max_tokens", "8")
        set_field(page, "input", PROMPT)
        page.click("#send")
        wait_idle(page)
        reply = stored_messages(page)[-1]
        assert reply["content"] and not reply.get("error"), reply
        # Only the refused calls' own 401s reach the console.
        assert all("401" in error for error in recorder.errors), recorder.errors
        assert not recorder.foreign(server.base_url)
    finally:
        context.close()
        stop_server(server)


@pytest.mark.slow
def test_compare_shows_a_loss_as_a_loss_and_each_reply_what_the_policy_chose(page: Any) -> None:
    """The page's own renderer, fed a comparison where speculation took twice the target's time and
    stats that count the policy's decisions: the speed verdict says slower, in the loss's colour."""
    stats_on = {"wall_s": 2.0, "drafting_decisions": {"off: measured slower": 30, "prompt lookup": 5}}
    rendered = page.evaluate(
        """(stats) => {
            const node = renderCompare(document.createElement("div"), {
                prompt: "p", on: {content: "a", runs: [], stats: stats}, off: {content: "a", runs: [],
                stats: {wall_s: 1.0}}});
            const speed = node.querySelectorAll(".verdict")[1];
            return {cls: speed.className, text: speed.textContent,
                    stats: node.querySelector(".column.on .stats").textContent};
        }""",
        stats_on,
    )
    assert rendered["cls"] == "verdict slower"
    assert "0.50×" in rendered["text"] and "slower" in rendered["text"] and "50% lost" in rendered["text"]
    assert "steps: off: measured slower 30, prompt lookup 5" in rendered["stats"]
    faster = page.evaluate(
        """() => renderCompare(document.createElement("div"), {prompt: "p",
            on: {content: "a", runs: [], stats: {wall_s: 1.0}}, off: {content: "a", runs: [],
            stats: {wall_s: 2.0}}}).querySelectorAll(".verdict")[1].className"""
    )
    assert faster == "verdict faster"
