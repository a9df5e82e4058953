"""MkDocs hook: fills in the parts of the pages that are made from the code.

A page line `<!-- generated: NAME -->` becomes `funke.deploy.sitedocs.render(NAME)` (state
machines, configuration keys, REST routes, gRPC services, metrics, command-line help), so the
site cannot drift from the code; a part that cannot be made fails the build."""

from __future__ import annotations

from mkdocs.exceptions import PluginError

from funke.deploy import sitedocs


def on_page_markdown(markdown, page, config, files):
    try:
        return sitedocs.expand(markdown, page.file.src_uri)
    except sitedocs.DocsError as exc:
        raise PluginError(str(exc)) from None
