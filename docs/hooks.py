"""MkDocs hooks: the pages that must not drift from the code are generated at build time.

- `<!-- generated: config-keys -->` becomes the configuration reference, read from
  app/config/keys.py's SECTIONS (the table the loader, its validation and the template come from).
- `<!-- generated: openapi -->` becomes the HTTP API reference, rendered as Markdown from the
  OpenAPI document the app builds (no script or CDN: the site works offline), and the document
  itself is written to the site as reference/openapi.json.
- `<!-- generated: client-api -->` becomes mkdocstrings' `:::` blocks for the Python client:
  `webhook_broker_client` once its distribution is in clients/python, `app.client` before.

Markers rather than hand copies: a key, route or docstring changed in the code changes the site
at the next `mkdocs build`, and `--strict` fails the build if the generation breaks.
"""

from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
CLIENT_SOURCES = (ROOT / "clients" / "python" / "src", ROOT / "clients" / "python")

CONFIG_MARKER = "<!-- generated: config-keys -->"
OPENAPI_MARKER = "<!-- generated: openapi -->"
CLIENT_MARKER = "<!-- generated: client-api -->"
# Pages other changes write: the nav lists each under its section once it is there (a nav entry
# for a missing page would fail the strict build), and the upgrade page links the Go keys.
GO_KEYS_PAGE = "go-config-keys.md"
OPTIONAL_PAGES = {
    GO_KEYS_PAGE: ("Operations", "Go configuration keys"),
    "upgrading-dependencies.md": ("Operations", "Upgrading dependencies"),
}
# Written as a code span, so the page reads on GitHub before the file is there; a link on the site
# once it is.
GO_KEYS_MENTION = f"`docs/{GO_KEYS_PAGE}`"


def _import_path() -> None:
    # The hook runs inside mkdocs' process, whose working directory need not be the repository.
    for path in (ROOT, *CLIENT_SOURCES):
        if path.is_dir() and str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_reference() -> str:
    """Every section and key of app/config/keys.py's SECTIONS, as Markdown tables."""
    _import_path()
    from app.config import IGNORED_SECTIONS, SECTIONS

    lines: list[str] = []
    for section in SECTIONS:
        lines += [f"### `[{section.name}]`", ""]
        if section.help:
            lines += [_cell(section.help), ""]
        lines += ["| key | default | what it does |", "|---|---|---|"]
        for key in section.keys:
            default = f"`{_cell(key.default)}`" if key.default else "*(empty)*"
            what = _cell(key.help)
            if not key.implemented:
                what += " *A Go key with no meaning here: any valid value is logged as unused.*"
            if key.secret:
                what += " *Secret: never printed.*"
            env = f"WEBHOOK_BROKER__{section.name}__{key.name}".upper().replace("-", "_")
            lines.append(f"| `{key.name}`<br>`{env}` | {default} | {what} |")
        lines.append("")
    if IGNORED_SECTIONS:
        lines += [
            "### Sections of the Go original read and not acted on",
            "",
            "| section | keys | why |",
            "|---|---|---|",
        ]
        for name, (why, keys) in IGNORED_SECTIONS.items():
            names = ", ".join(f"`{key}`" for key in keys)
            lines.append(f"| `[{name}]` | {names} | {_cell(why)} |")
        lines.append("")
    return "\n".join(lines)


def openapi_document() -> dict[str, Any]:
    """The document `GET /openapi.json` serves for a default configuration."""
    _import_path()
    from app.api.app import create_app
    from app.config import load_config_text

    document: dict[str, Any] = create_app(load_config_text("")).openapi()
    return document


def openapi_markdown(document: dict[str, Any]) -> str:
    from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler  # type: ignore[import-untyped]

    rendered: str = OpenAPIV3DocumentationHandler(document, style="MKDOCS").write()
    return rendered


def client_module() -> str:
    if any((path / "webhook_broker_client" / "__init__.py").is_file() for path in CLIENT_SOURCES):
        return "webhook_broker_client"
    return "app.client"


def client_reference() -> str:
    module = client_module()
    blocks = [
        (f"{module}.Broker", "The broker: administration, publishing, and its consumers."),
        (f"{module}.PullConsumer", "One pull consumer: consume, fetch, next, info, unpin."),
        (f"{module}.ConsumeContext", "What `consume()` returns: iterate it, stop, drain, wait."),
        (f"{module}.Job", "A job handed to a worker, and how it is settled."),
        (f"{module}.Published", "What a publish answers."),
        (f"{module}.ConsumerInfo", "A consumer's figures, as `info()` returns them."),
        (f"{module}.sync.SyncBroker", "The same broker without async, for scripts."),
        (f"{module}.errors", "What the client raises."),
    ]
    lines = [f"The module is `{module}`.", "", "| | |", "|---|---|"]
    lines += [f"| `{target.removeprefix(module + '.')}` | {what} |" for target, what in blocks]
    lines.append("")
    for target, _ in blocks:
        lines += [f"::: {target}", "    options:", "      heading_level: 2", ""]
    return "\n".join(lines)


_openapi: dict[str, Any] = {}


def _go_keys_present(config: MkDocsConfig) -> bool:
    return (Path(config.docs_dir) / GO_KEYS_PAGE).is_file()


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    _openapi.clear()
    _openapi.update(openapi_document())
    for page, (section, title) in OPTIONAL_PAGES.items():
        if (Path(config.docs_dir) / page).is_file():
            _add_to_nav(config, section, title, page)
    return config


def _add_to_nav(config: MkDocsConfig, section: str, title: str, page: str) -> None:
    for entry in config.nav or []:
        if isinstance(entry, dict) and isinstance(entry.get(section), list):
            pages = entry[section]
            listed = [item for item in pages if isinstance(item, dict)]
            if not any(page in item.values() for item in listed):
                pages.append({title: page})


def on_files(files: Files, config: MkDocsConfig) -> Files:
    text = json.dumps(_openapi, indent=2, sort_keys=False)
    files.append(File.generated(config, "reference/openapi.json", content=text))
    return files


@event_priority(100)  # before any plugin reads the page (search, mkdocstrings' autorefs)
def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if OPENAPI_MARKER in markdown:
        markdown = markdown.replace(OPENAPI_MARKER, openapi_markdown(_openapi))
    if CLIENT_MARKER in markdown:
        markdown = markdown.replace(CLIENT_MARKER, client_reference())
    if GO_KEYS_MENTION in markdown and _go_keys_present(config):
        target = posixpath.relpath(GO_KEYS_PAGE, posixpath.dirname(page.file.src_uri))
        markdown = markdown.replace(GO_KEYS_MENTION, f"[Go configuration keys]({target})")
    return markdown
