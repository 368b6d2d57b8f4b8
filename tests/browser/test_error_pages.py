"""The shop's 404 and 500 pages in a real Chromium, on a desktop and a phone, in
English and Simplified Chinese: the shop's layout, the page's words, no sideways
scrolling, and a button that leads back to the shop. Photographed as
test-artifacts/screenshots/error-*."""

import pytest

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.ledger.error_urls"),  # with a page that fails
]

BRAND = "rgb(37, 99, 235)"  # --brand in static/css/app.css
WORDS = {
    "en": {
        404: "Page not found",
        500: "Something went wrong",
        "back": "Go to the shop",
    },
    "zh-hans": {404: "页面不存在", 500: "出错了", "back": "前往商店"},
}


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize(("status", "path"), [(404, "/no-such"), (500, "/test/broken")])
def test_an_error_page_leads_back_to_the_shop(
    browser, live_server, shot, width, language, status, path
):
    ctx = browser.new_context(
        base_url=live_server.url,
        viewport={"width": width, "height": 900 if width > 600 else 844},
        is_mobile=width < 600,
        extra_http_headers={"Accept-Language": language},
    )
    ctx.set_default_timeout(15_000)
    page = ctx.new_page()
    answer = page.goto(path)
    assert answer is not None and answer.status == status
    words = WORDS[language]
    assert page.locator("h1").inner_text() == words[status]
    back = page.get_by_role("link", name=words["back"])
    # The shop's stylesheet applied: the button in the brand's blue.
    assert back.evaluate("e => getComputedStyle(e).backgroundColor") == BRAND
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{path} is {scroll} px wide on a {width} px screen"
    shot(page, f"error-{status}-{width}-{language}")
    back.click()
    page.wait_for_load_state()
    assert page.url.rstrip("/") != f"{live_server.url}{path}"
    assert page.locator("h1").inner_text() not in (words[404], words[500])
    ctx.close()
