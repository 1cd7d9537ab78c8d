"""The console at phone width and by keyboard alone, with enough contrast, in light and dark
(issue 38), in a real browser (Debian's Chromium) against a live broker process on PostgreSQL.

Contrast is WCAG 2.1's: every visible piece of text (and each form control's value and
placeholder) against the background it is drawn on, found by compositing the backgrounds of
its ancestors; 4.5:1 for normal text, 3:1 for large (24px, or 18.66px bold). The charts'
colours are checked where uPlot draws them: in the canvas's own pixels."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.ui.conftest import (
    ADMIN,
    WAIT_MS,
    admin_http,
    kill_all,
    publish,
    signed_in,
)

expect.set_options(timeout=WAIT_MS)

PHONE: ViewportSize = {"width": 375, "height": 740}
SCHEMES = ("light", "dark")

# The checks, in the page. Each is a function of one argument, evaluated by Playwright (which
# the pages' Content-Security-Policy does not stop: it is not the page's own script).
CONTRAST_JS = """
(args) => {
  const parse = (text) => {
    const m = /rgba?\\(([^)]*)\\)/.exec(text || "");
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const hex = (h) => {
    const v = h.trim().replace("#", "");
    return [0, 2, 4].map((i) => parseInt(v.slice(i, i + 2), 16)).concat([1]);
  };
  const over = (top, bottom) =>
    [0, 1, 2].map((i) => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const luminance = (c) => {
    const f = (v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = (a, b) => {
    const x = luminance(a), y = luminance(b);
    return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
  };
  // The colour an element's box shows: its own background and its ancestors', composited
  // over the page's canvas colour.
  const canvasColour = () => {
    const probe = document.createElement("div");
    probe.style.backgroundColor = "Canvas";
    document.body.appendChild(probe);
    const c = parse(getComputedStyle(probe).backgroundColor);
    probe.remove();
    return c;
  };
  const backgroundOf = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const bg = parse(getComputedStyle(e).backgroundColor);
      if (bg && bg[3] > 0) { layers.push(bg); if (bg[3] >= 1) break; }
    }
    let colour = canvasColour();
    for (let i = layers.length - 1; i >= 0; i--) colour = over(layers[i], colour);
    return colour;
  };
  const opacityOf = (el) => {
    let o = 1;
    for (let e = el; e; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity);
    return o;
  };
  const shown = (el) => {
    if (!el.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true })) return false;
    const r = el.getBoundingClientRect();
    if (r.width <= 1 || r.height <= 1) return false;  // screen-reader-only text
    return r.right > 0;  // not moved off the page (the skip link, until focused)
  };
  const large = (style) => {
    const size = parseFloat(style.fontSize), weight = parseInt(style.fontWeight, 10);
    return size >= 24 || (size >= 18.66 && weight >= 700);
  };
  const describe = (el) => {
    let path = el.tagName.toLowerCase();
    if (el.id) path += "#" + el.id;
    else if (el.classList.length) path += "." + Array.from(el.classList).join(".");
    const p = el.parentElement;
    if (!p) return path;
    return p.tagName.toLowerCase() + (p.id ? "#" + p.id : "") + " > " + path;
  };
  const check = (el, colourText, text, pseudo) => {
    const style = getComputedStyle(el, pseudo);
    let fg = parse(colourText || style.color);
    const bg = backgroundOf(el);
    fg = over([fg[0], fg[1], fg[2], fg[3] * opacityOf(el)], bg);
    const need = large(getComputedStyle(el)) ? 3 : 4.5;
    const r = ratio(fg, bg);
    return { where: describe(el) + (pseudo || ""), text: text.trim().slice(0, 40),
             fg: fg.slice(0, 3).map(Math.round), bg: bg.slice(0, 3).map(Math.round),
             ratio: Math.round(r * 100) / 100, need: need, ok: r >= need };
  };

  if (args.unit) {
    return args.unit.map(([a, b]) => Math.round(ratio(hex(a), hex(b)) * 100) / 100);
  }
  if (args.over) {  // colours (hex) against an element's background (or its parent's)
    let el = document.querySelector(args.over.selector);
    if (args.over.parent) el = el.parentElement;
    const bg = backgroundOf(el);
    return args.over.colours.map((c) => Math.round(ratio(hex(c), bg) * 100) / 100);
  }
  const results = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el || seen.has(el)) continue;
    // Fallback content the browser does not draw, and options (their select is checked).
    if (el.closest("script, style, template, option, noscript, progress, canvas")) continue;
    seen.add(el);
    if (shown(el)) results.push(check(el, null, n.textContent, null));
  }
  document.querySelectorAll("input:not([type=hidden]), select, textarea").forEach((el) => {
    if (!shown(el)) return;
    const value = el.tagName === "SELECT" ? el.options[el.selectedIndex]?.text || "" : el.value;
    if (value) results.push(check(el, null, value, null));
    if (el.placeholder && !el.value) {
      const colour = getComputedStyle(el, "::placeholder").color;
      results.push(check(el, colour, el.placeholder, "::placeholder"));
    }
  });
  return results;
}
"""

# Whether the page scrolls sideways, and what sticks out of the viewport if it does.
OVERFLOW_JS = """
() => {
  const root = document.scrollingElement;
  const width = root.clientWidth;
  const out = [];
  document.querySelectorAll("body *").forEach((el) => {
    const r = el.getBoundingClientRect();
    if (r.right > width + 0.5 && !el.closest(".scroll, .history, pre")) {
      out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
               (el.className && typeof el.className === "string" ? "." + el.className : "") +
               " right=" + Math.round(r.right));
    }
  });
  return { scrollWidth: root.scrollWidth, clientWidth: width, out: out.slice(0, 10) };
}
"""

# The focused element and how its focus shows.
FOCUS_JS = """
() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const s = getComputedStyle(el);
  const outline = s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0;
  const shadow = s.boxShadow && s.boxShadow !== "none";
  // Marked, to find its parent's background; named by what it is rather than by the node, since
  // a live update replaces the overview's rows with equal ones.
  const probe = "data-focus-probe";
  document.querySelectorAll("[" + probe + "]").forEach((e) => e.removeAttribute(probe));
  el.setAttribute(probe, "");
  const text = (el.innerText || el.value || "").trim().slice(0, 40);
  const href = el.getAttribute("href");
  return { id: [el.tagName, el.id, href, el.getAttribute("name"), text].join("|"),
           tag: el.tagName.toLowerCase(), href: href, text: text, type: el.getAttribute("type"),
           visible: Boolean(outline || shadow), outline: s.outlineColor,
           parent: el.parentElement ? el.parentElement.tagName : "" };
}
"""

# Every element Tab stops at, in document order (none here sets a positive tabindex).
TABBABLE_JS = """
() => Array.from(document.querySelectorAll(
    "a[href], button, input:not([type=hidden]), select, textarea, [tabindex]"))
  .filter((el) => el.tabIndex >= 0 && !el.disabled &&
          el.checkVisibility({ checkVisibilityCSS: true }))
  .length
"""

# The colours a canvas shows (mostly) opaque, counted: uPlot draws on a transparent canvas, so
# a line of a colour leaves pixels of that colour (its anti-aliased edges are the same colour,
# partly transparent; where it crosses another colour they mix).
PIXELS_JS = """
([selector, colours, minAlpha, near]) => {
  const canvas = document.querySelector(selector);
  if (!canvas) return colours.map(() => 0);  // between a live update's swap and its redraw
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const wanted = colours.map((h) => {
    const v = h.trim().replace("#", "");
    return [0, 2, 4].map((i) => parseInt(v.slice(i, i + 2), 16));
  });
  const counts = wanted.map(() => 0);
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] < minAlpha) continue;
    wanted.forEach((w, k) => {
      if (Math.abs(data[i] - w[0]) <= near && Math.abs(data[i + 1] - w[1]) <= near &&
          Math.abs(data[i + 2] - w[2]) <= near) counts[k]++;
    });
  }
  return counts;
}
"""

MULTIPART = ("datetime-local", "date", "time")
CHART_VARS = ("--chart-axis", "--chart-grid", "--chart-line", "--chart-area")


@pytest.fixture(scope="module")
def scene(broker: str) -> dict[str, Any]:
    """Something on every page: queued jobs, dead jobs with an attempt each, a paused
    consumer, an audit entry or two."""
    publish(broker, "billing", [{"n": n} for n in range(5)], "queued")
    publish(broker, "fulfil", [{"order": {"id": f"o-{n}"}} for n in range(6)], "order")
    kill_all(broker, "fulfil", 6, "card declined")
    until = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    with admin_http(broker) as http:
        r = http.put("/channel/held/consumer/held/pause", data={"until": until.isoformat()})
        assert r.status_code == 200, r.text
    return {"until": until}


def dead_job_path(page: Page) -> str:
    page.goto("/ui/c/fulfil/fulfil?status=DEAD")
    link = page.locator("table.jobs tbody tr a").first
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href
    return href


def contrast(page: Page, **args: Any) -> Any:
    return page.evaluate(CONTRAST_JS, args)


def failures(page: Page) -> list[dict[str, Any]]:
    found = contrast(page)
    assert found, "no text found to check"
    return [r for r in found if not r["ok"]]


def test_the_contrast_ratio_is_wcags(broker: str, browser: Browser, scene: dict[str, Any]) -> None:
    """The ratio function itself, on pairs whose WCAG ratios are known, and the page check
    catching a colour that falls short."""
    page = signed_in(browser, broker, ADMIN)
    pairs = [
        ("#000000", "#ffffff"),
        ("#ffffff", "#ffffff"),
        ("#777777", "#ffffff"),  # 4.48: the grey that just fails for normal text
        ("#767676", "#ffffff"),  # 4.54: the one that just passes
        ("#0645ad", "#f5f5f5"),
    ]
    assert contrast(page, unit=pairs) == [21.0, 1.0, 4.48, 4.54, 7.82]
    assert failures(page) == []
    # Grey text of the page's own: found, named, measured. (CSSOM, which the page's CSP allows.)
    page.evaluate("document.querySelector('p.legend').style.color = '#999999'")
    page.emulate_media(color_scheme="light")
    failed = failures(page)
    assert [f["where"] for f in failed] == ["main#main > p.legend"], failed
    assert failed[0]["ratio"] == 2.85 and failed[0]["need"] == 4.5
    # Large text needs 3:1 only: 3.45 passes there.
    page.evaluate(
        "(() => { const h = document.querySelector('h1'); h.style.fontSize = '24px';"
        " h.style.color = '#8a8a8a'; })()"
    )
    assert [f["where"] for f in failures(page)] == ["main#main > p.legend"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_page_has_enough_contrast(
    broker: str, browser: Browser, scene: dict[str, Any], scheme: str
) -> None:
    context = browser.new_context(base_url=broker, color_scheme=scheme)  # type: ignore[arg-type]
    anonymous = context.new_page()
    anonymous.set_default_timeout(WAIT_MS)
    anonymous.goto("/ui/signin")
    checked: dict[str, list[dict[str, Any]]] = {"signin": failures(anonymous)}
    anonymous.fill("#token", "not-a-token")
    anonymous.click("button[type=submit]")
    expect(anonymous.locator(".error")).to_be_visible()
    checked["signin refused"] = failures(anonymous)
    context.close()

    page = signed_in(browser, broker, ADMIN)
    page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
    assert page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") is (scheme == "dark")
    expect(page.locator('tr[data-key="held/held"] .paused')).to_be_visible()
    checked["overview"] = failures(page)
    job = dead_job_path(page)
    checked["dead jobs"] = failures(page)
    page.goto("/ui/c/fulfil/fulfil?status=ANY&payload=o-1&done=requeued&n=3")
    expect(page.locator(".done")).to_be_visible()
    checked["search, done"] = failures(page)
    page.goto("/ui/c/held/held?since=yesterday")
    expect(page.locator(".error")).to_be_visible()
    expect(page.locator("#pause-state")).to_be_visible()
    checked["paused, bad filter"] = failures(page)
    page.goto(job)
    expect(page.locator("#attempt-history tr.attempt")).to_have_count(1)
    checked["job"] = failures(page)
    page.goto(job.replace("/job/", "/confirm/delete-job?job="))
    expect(page.locator("form.confirm button.danger")).to_be_visible()
    checked["confirm delete"] = failures(page)
    page.goto("/ui/c/fulfil/fulfil/confirm/redrive-matching?status=DEAD")
    checked["confirm redrive"] = failures(page)
    page.goto("/ui/audit")
    checked["audit"] = failures(page)
    page.goto("/ui/c/fulfil/fulfil/job/987654321")
    checked["error"] = failures(page)
    bad = {name: found for name, found in checked.items() if found}
    assert bad == {}


def test_the_charts_take_the_schemes_colours(
    broker: str, browser: Browser, scene: dict[str, Any]
) -> None:
    page = signed_in(browser, broker, ADMIN)
    # The history the charts draw is sampled while an overview page is open.
    spark = 'tr[data-key="billing/billing"] .spark canvas'
    expect(page.locator(spark)).to_have_count(1)
    colours: dict[str, list[str]] = {}
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        colours[scheme] = [
            page.evaluate(f"getComputedStyle(document.documentElement).getPropertyValue('{v}')")
            for v in CHART_VARS
        ]
    light, dark = colours["light"], colours["dark"]
    assert all(a.strip() != b.strip() for a, b in zip(light, dark, strict=True)), colours

    page.goto("/ui/c/billing/billing?status=ANY")
    chart = "#consumer-chart canvas"
    expect(page.locator(chart)).to_have_count(1)
    for scheme, other in (("light", "dark"), ("dark", "light"), ("light", "dark")):
        # No reload: the charts are drawn again when the scheme changes.
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        axis, grid, line, _ = colours[scheme]
        # Axis text and ticks as text (4.5:1), grid and series as graphics (3:1), against the
        # card the chart sits on.
        ratios = contrast(page, over={"selector": "#consumer-chart", "colours": colours[scheme]})
        assert ratios[0] >= 4.5 and min(ratios[1:]) >= 3, (scheme, ratios)
        _eventually_drawn(page, chart, [axis, grid, line])
        # Not one opaque pixel of the other scheme's colours.
        stale = page.evaluate(PIXELS_JS, [chart, colours[other][:3], 255, 2])
        assert stale == [0, 0, 0], (scheme, stale)

    page.goto("/ui/")
    expect(page.locator(spark)).to_have_count(1)
    # The small charts too: both series' colours meet 3:1 against the table, and the queued
    # depth's line (billing's jobs wait: a steady depth, no deliveries) is drawn in the scheme's.
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        line, area = colours[scheme][2:]
        ratios = contrast(
            page,
            over={"selector": 'tr[data-key="billing/billing"] .spark', "colours": [line, area]},
        )
        assert min(ratios) >= 3, (scheme, ratios)
        _eventually_drawn(page, spark, [area])


def _eventually_drawn(page: Page, selector: str, colours: list[str]) -> None:
    """Wait until the canvas under `selector` shows every one of `colours` (a redraw is a
    new canvas, made in the scheme change's own event)."""
    page.wait_for_function(
        f"(args) => ({PIXELS_JS})(args).every((n) => n > 0)", arg=[selector, colours, 160, 3]
    )


@pytest.mark.parametrize(
    "where",
    ["overview", "jobs", "dead letters", "job", "confirm", "audit"],
)
def test_pages_fit_a_phone(
    broker: str, browser: Browser, scene: dict[str, Any], where: str
) -> None:
    page = signed_in(browser, broker, ADMIN, viewport=PHONE)
    if where == "jobs":
        page.goto("/ui/c/billing/billing?status=ANY")
        expect(page.locator("table.jobs tbody tr a").first).to_be_visible()
    elif where == "dead letters":
        page.goto("/ui/c/fulfil/fulfil")
        expect(page.locator("table.jobs tbody tr").first).to_be_visible()
    elif where == "job":
        page.goto(dead_job_path(page))
        expect(page.locator("#attempt-history tr.attempt")).to_have_count(1)
    elif where == "confirm":
        page.goto("/ui/c/fulfil/fulfil/confirm/redrive-matching?status=DEAD")
    elif where == "audit":
        page.goto("/ui/audit")
    found = page.evaluate(OVERFLOW_JS)
    assert found["scrollWidth"] <= found["clientWidth"], found
    # The navigation and every action are on screen, inside the phone's width.
    targets = page.locator(
        "header nav a, header button, a.action, main button[type=submit], form.confirm a"
    )
    assert targets.count() >= 3
    for i in range(targets.count()):
        box = targets.nth(i).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (
            targets.nth(i).inner_text(),
            box,
        )
    if where == "dead letters":
        expect(page.locator("a.action", has_text="Requeue matching")).to_be_visible()
        expect(page.locator("#pause")).to_be_visible()
    if where == "job":
        expect(page.locator("a.action", has_text="Requeue")).to_be_visible()


class Keyboard:
    """Tab and Enter only, checking each stop: focus shows (an outline or a shadow, 3:1 against
    what is behind it), and every Tab moves it on."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.stops: list[dict[str, Any]] = []

    def focused(self) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.page.evaluate(FOCUS_JS)
        return found

    def tab(self) -> dict[str, Any] | None:
        """Tab to the next control; None when the focus has left the page's last one."""
        before = self.focused()
        self.page.keyboard.press("Tab")
        now = self.focused()
        # A date and time field is one control of several parts (day, month, year, hours…),
        # which Tab visits in turn before it leaves the field.
        parts = 0
        while now is not None and before is not None and now["id"] == before["id"]:
            assert now["type"] in MULTIPART and parts < 8, ("focus stuck", now)
            self.page.keyboard.press("Tab")
            now, parts = self.focused(), parts + 1
        if now is not None:
            assert now["visible"], ("focus not shown", now)
            rgb = re.findall(r"[\d.]+", now["outline"])[:3]
            hexed = "#" + "".join(f"{round(float(p)):02x}" for p in rgb)
            # The ring is drawn outside the element: against its parent's background.
            [against] = contrast(
                self.page,
                over={"selector": "[data-focus-probe]", "colours": [hexed], "parent": True},
            )
            assert against >= 3, ("focus ring too faint", now, against)
            self.stops.append(now)
        return now

    def tab_to(self, wanted: str, limit: int = 80) -> dict[str, Any]:
        """Tab until the focused element matches the CSS selector `wanted`."""
        for _ in range(limit):
            now = self.tab()
            if now is not None and self.page.evaluate(
                "(s) => document.activeElement.matches(s)", wanted
            ):
                return now
        raise AssertionError(f"Tab never reached {wanted}: {[s['text'] for s in self.stops]}")

    def enter(self) -> None:
        self.page.keyboard.press("Enter")

    def round_trip(self) -> None:
        """Tab through the whole page and back to where it started: every stop reached, and
        none holds the focus (no trap)."""
        count: int = self.page.evaluate(TABBABLE_JS)
        first = self.tab()
        assert first is not None
        visited = {first["id"]}
        for _ in range(count + 2):
            now = self.tab()
            if now is None:  # past the last stop: the browser's own UI, then the first again
                continue
            if now["id"] == first["id"]:
                break
            visited.add(now["id"])
        else:
            raise AssertionError(f"focus never came back round: {len(visited)} of {count}")
        assert len(visited) == count, (len(visited), count)


def test_sign_in_and_requeue_a_dead_job_by_keyboard_alone(
    broker: str, browser: Browser, scene: dict[str, Any]
) -> None:
    context = browser.new_context(base_url=broker, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto("/ui/")
    keys = Keyboard(page)
    # The token field has the focus at once (autofocus).
    expect(page.locator("#token")).to_be_focused()
    page.keyboard.type(ADMIN)
    keys.enter()
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator('tr[data-key="fulfil/fulfil"]')).to_be_visible()
    keys.round_trip()
    keys.stops.clear()
    keys.tab_to('header nav a[href="/ui/audit"]')
    keys.tab_to('a[href="/ui/c/fulfil/fulfil"]')
    nav = [s["href"] for s in keys.stops if s["parent"] == "NAV"]
    assert nav == ["/ui/", "/ui/audit"], keys.stops
    keys.enter()
    expect(page.locator("h1")).to_contain_text("fulfil / fulfil")
    keys.round_trip()
    keys.tab_to("table.jobs tbody a")
    keys.enter()
    expect(page.locator("h1")).to_contain_text("DEAD")
    job_url = page.url
    keys.round_trip()
    keys.tab_to("a.action:not(.danger)")
    keys.enter()
    expect(page.locator("#confirm-count")).to_contain_text("1")
    keys.round_trip()
    keys.tab_to("form.confirm button[type=submit]")
    keys.enter()
    expect(page.locator(".done")).to_contain_text("requeued")
    assert page.url.split("?")[0] == job_url.split("?")[0]
    expect(page.locator("h1 .status")).not_to_have_text("DEAD")
    context.close()


def test_a_live_update_keeps_the_keyboards_place(
    broker: str, browser: Browser, scene: dict[str, Any]
) -> None:
    page = signed_in(browser, broker, ADMIN)
    page.evaluate(
        "window.__updates = 0;"
        " document.addEventListener('htmx:afterSettle', () => { window.__updates += 1; })"
    )
    keys = Keyboard(page)
    keys.tab_to('a[href="/ui/c/fulfil/fulfil"]')
    row = page.locator('tr[data-key="fulfil/fulfil"]')
    page.evaluate("document.querySelector('#consumers tr').dataset.old = '1'")
    # A published job is a change the table announces: the rows are replaced.
    publish(broker, "billing", ["one more"], "more")
    page.wait_for_function("() => window.__updates > 0 && !document.querySelector('tr[data-old]')")
    expect(row.locator("a").first).to_be_focused()
    keys.enter()
    expect(page.locator("h1")).to_contain_text("fulfil / fulfil")
