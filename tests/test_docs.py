"""The documentation: the MkDocs site builds with --strict (broken links and anchors fail), its
pages render in a real headless Chromium served over HTTP with nothing fetched from elsewhere,
the generated pages hold what the code declares, and README.md stays a short front door whose
every relative link and anchor resolves (on GitHub too, so GitHub's heading slugs)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from playwright.sync_api import Browser, Page, Request

from app.config import SECTIONS
from tests.helpers.browser import chromium

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEADLINE_MS = 15_000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def _open(browser: Browser, url: str, elsewhere: list[str]) -> Page:
    page = browser.new_page()
    page.set_default_timeout(DEADLINE_MS)
    origin = urlparse(url).netloc

    def record(request: Request) -> None:
        target = urlparse(request.url)
        if target.scheme in ("http", "https", "ws", "wss") and target.netloc != origin:
            elsewhere.append(request.url)

    page.on("request", record)
    page.goto(url, wait_until="load")
    return page


def _check_renders(page: Page, title: str) -> None:
    # Navigation: the site's sections, each a link that leads somewhere on the site.
    nav = page.locator("nav.md-nav--primary")
    for section in ("Getting started", "Concepts", "Guides", "Operations", "Reference"):
        assert nav.get_by_text(section, exact=True).first.count() == 1, section
    assert nav.locator("a.md-nav__link[href]").count() >= 20
    # The page's own title, rendered as its first heading.
    assert page.locator("article.md-content__inner h1").first.inner_text().strip().startswith(title)
    # A code block, highlighted, with text in it and its copy button.
    block = page.locator("article.md-content__inner div.highlight pre code").first
    block.wait_for(state="visible")
    assert block.inner_text().strip()
    # The search box: it opens, takes a query and lists results from the built index.
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box = page.locator("input.md-search__input")
    box.wait_for(state="visible")
    # Typed key by key: Material searches on key events, which fill() does not send.
    box.press_sequentially("lease", delay=20)
    page.locator(".md-search-result__item").first.wait_for(state="visible")
    assert page.locator(".md-search-result__item").count() > 0
    page.keyboard.press("Escape")


def test_home_page_renders(browser: Browser, served: str) -> None:
    elsewhere: list[str] = []
    page = _open(browser, f"{served}/index.html", elsewhere)
    _check_renders(page, "webhook-broker")
    page.get_by_role("link", name="Getting started").first.click()
    page.wait_for_url("**/getting-started.html")
    assert "The client's five lines" in page.locator("article.md-content__inner").inner_text()
    page.close()
    assert not elsewhere, f"the site fetched from elsewhere: {elsewhere}"


def test_a_guide_renders(browser: Browser, served: str) -> None:
    elsewhere: list[str] = []
    page = _open(browser, f"{served}/guides/pull-http.html", elsewhere)
    _check_renders(page, "Pull workers over HTTP")
    article = page.locator("article.md-content__inner").inner_text()
    assert "/channel/{c}/consumer/{k}/pull" in article
    page.close()
    assert not elsewhere, f"the site fetched from elsewhere: {elsewhere}"


def test_configuration_reference_is_every_key(site: Path) -> None:
    text = _text(site / "operations" / "configuration.html")
    for section in SECTIONS:
        assert f"[{section.name}]" in text
        for key in section.keys:
            assert key.name in text, f"[{section.name}] {key.name}"
            env = f"WEBHOOK_BROKER__{section.name}__{key.name}".upper().replace("-", "_")
            assert env in text


def test_http_reference_is_the_openapi_document(site: Path) -> None:
    from app.api.app import create_app
    from app.config import load_config_text

    document = create_app(load_config_text("")).openapi()
    served = json.loads((site / "reference" / "openapi.json").read_text())
    assert served == json.loads(json.dumps(document))
    text = re.sub(r"<[^>]+>", "", (site / "reference" / "http-api.html").read_text())
    for path, operations in document["paths"].items():
        assert path in text, path
        for method in operations:
            assert f"{method.upper()} {path}" in text, f"{method} {path}"


def test_client_reference_is_from_docstrings(site: Path) -> None:
    html = (site / "reference" / "client.html").read_text()
    module = "webhook_broker_client"
    if not (ROOT / "clients" / "python" / "src" / module).is_dir():
        module = "app.client"
    for name in ("Broker.publish", "PullConsumer.consume", "Job.ack", "sync.SyncBroker"):
        assert f'id="{module}.{name}"' in html, name


def _text(path: Path) -> str:
    html = re.sub(r"<script.*?</script>", " ", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&amp;", "&")


# -- README.md --------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(markdown: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_anchors(markdown: str) -> set[str]:
    """The ids GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces
    as dashes, a repeated one numbered from -1."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in _prose(markdown):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def relative_links(markdown: str) -> list[str]:
    links = []
    for line in _prose(markdown):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                links.append(target)
    return links


def unresolved(markdown_file: Path) -> list[str]:
    problems = []
    for target in relative_links(markdown_file.read_text()):
        path, _, anchor = target.partition("#")
        file = (markdown_file.parent / unquote(path)).resolve() if path else markdown_file
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            problems.append(f"{target}: no such heading")
    return problems


def test_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines"
    assert relative_links(README.read_text()), "the README links into the docs"


def test_every_readme_link_resolves() -> None:
    assert unresolved(README) == []


def test_the_link_check_finds_broken_links(tmp_path: Path) -> None:
    twice = "## A `code` heading, twice\n\n"
    (tmp_path / "other.md").write_text(f"# Other page\n\n{twice}{twice}")
    good = tmp_path / "good.md"
    good.write_text(
        "# Title\n\n## Next steps\n\n[a](other.md) [b](other.md#a-code-heading-twice-1) "
        "[c](#next-steps) [d](https://example.com/x.md) `[e](nowhere.md)`\n\n"
        "```\n[f](nowhere.md)\n```\n"
    )
    assert unresolved(good) == []
    bad = tmp_path / "bad.md"
    bad.write_text("# Title\n\n[a](missing.md) [b](other.md#nope) [c](#no-heading)\n")
    assert unresolved(bad) == [
        "missing.md: no such file",
        "other.md#nope: no such heading",
        "#no-heading: no such heading",
    ]
