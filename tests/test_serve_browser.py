"""The chat page at ``/`` in a real browser: Debian's chromium driven by Playwright's sync API.

Playwright must not download a browser (CI has no network for it), so it launches /usr/bin/chromium,
which .ci/run installs. The tiny model's text is gibberish but deterministic under greedy decoding, so
the page's streamed reply can be compared with the non-streaming API's answer to the same conversation.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from playwright.sync_api import expect, sync_playwright

from serve_helpers import Server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MAX_TOKENS = 64

# Keeps every text an assistant message shows, from the mutation records themselves: when several
# events arrive in one network read (the tiny model is fast), the DOM still changes once per event, but
# polling from Python, or reading textContent once per observer callback, would see only the last state.
RECORD_PARTIALS = """() => {
  window.partials = [];
  new MutationObserver((records) => {
    for (const r of records) {
      const el = r.target.nodeType === Node.TEXT_NODE ? r.target.parentElement : r.target;
      if (!el || !el.matches('.msg.assistant .content')) continue;
      if (r.type === 'characterData') window.partials.push(r.oldValue);  // the text before this change
      else for (const n of r.addedNodes) window.partials.push(n.textContent);
    }
  }).observe(document.getElementById('messages'),
             {subtree: true, childList: true, characterData: true, characterDataOldValue: true});
}"""


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium), as .ci/run does")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(model_dir):
    with Server(model_dir, "cpu") as s:
        yield s


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    page.set_default_timeout(20_000)
    expect.set_options(timeout=20_000)
    yield page
    context.close()


def open_chat(page, server: Server, max_tokens, temperature: float) -> None:
    page.goto(server.url + "/")
    page.click("details.settings summary")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", str(temperature))
    page.keyboard.press("Escape")  # closes the settings popover
    expect(page.locator("#temperature")).to_be_hidden()


def wait_for_reply(page, replies: int) -> str:
    """The text of assistant message number ``replies`` once its stream has finished."""
    expect(page.locator(".msg.assistant")).to_have_count(replies)
    expect(page.locator("[data-testid=streaming]")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    return page.locator(".msg.assistant .content").nth(replies - 1).text_content()


def api_reply(server: Server, messages: list[dict]) -> str:
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    request = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def test_page_streams_a_multi_turn_chat(page, server):  # page first: no server started if skipped
    health = server.get("/health")
    open_chat(page, server, MAX_TOKENS, 0)
    expect(page.locator("#model")).to_have_text(health["model"])
    expect(page.locator("#device")).to_have_text("cpu:0")
    expect(page.locator("#simulated")).to_be_hidden()

    page.evaluate(RECORD_PARTIALS)
    first = "What is continuous batching?"  # greedy, the tiny model writes all 64 tokens
    page.fill("#input", first)
    page.click("#send")
    reply = wait_for_reply(page, 1)
    assert reply == api_reply(server, [{"role": "user", "content": first}])

    partials = page.evaluate("window.partials")
    growing = [t for t in partials if t and t != reply]
    assert len(set(growing)) >= 2, f"the reply appeared at once, not streamed; texts seen: {partials!r}"
    assert all(reply.startswith(t) for t in growing), f"a partial text is not a prefix of the reply: {growing!r}"
    assert [len(t) for t in growing] == sorted(len(t) for t in growing), "the reply shrank while streaming"

    # Shift+Enter is a new line; Enter sends the whole conversation so far.
    page.click("#input")
    page.keyboard.type("And why")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("does it help?")
    assert page.input_value("#input") == "And why\ndoes it help?"
    expect(page.locator(".msg.user")).to_have_count(1)
    page.keyboard.press("Enter")
    second = wait_for_reply(page, 2)
    assert second == api_reply(server, [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                                        {"role": "user", "content": "And why\ndoes it help?"}])

    page.click("#new-chat")
    expect(page.locator(".msg")).to_have_count(0)


def test_page_shows_an_api_error_inline(page, server):
    open_chat(page, server, 100_000, 0)  # more than the 256-token context: the server answers 400
    page.fill("#input", "hello")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant .error")).to_contain_text("max_tokens (100000) exceeds")
    expect(page.locator("[data-testid=streaming]")).to_have_count(0)
    assert page.input_value("#input") == "hello", "the failed message should be offered again"


def test_page_labels_a_simulated_device(page, model_dir):
    with Server(model_dir, "npu") as npu:
        page.goto(npu.url + "/")
        expect(page.locator("#device")).to_have_text("npu:0")
        expect(page.locator("#simulated")).to_be_visible()
        expect(page.locator("#simulated")).to_contain_text("simulated")
        assert "(simulated)" in page.title()


def test_page_asks_for_the_api_key_and_keeps_it_for_the_tab(page, model_dir):
    with Server(model_dir, "cpu", "--api-key", "s3cret") as keyed:
        asked = []

        def answer(dialog):  # a wrong key first: the page says so and asks again
            asked.append(dialog.message)
            dialog.accept("wrong" if len(asked) == 1 else "s3cret")

        page.on("dialog", answer)
        open_chat(page, keyed, 8, 0)
        page.fill("#input", "hello")
        page.keyboard.press("Enter")
        wait_for_reply(page, 1)
        expect(page.locator(".msg.assistant .error")).to_have_count(0)
        assert len(asked) == 2 and "--api-key" in asked[0] and "refused" in asked[1], asked
        page.fill("#input", "and again")
        page.keyboard.press("Enter")
        wait_for_reply(page, 2)
        expect(page.locator(".msg.assistant .error")).to_have_count(0)
        assert len(asked) == 2, "the page asked for the key it already had"
