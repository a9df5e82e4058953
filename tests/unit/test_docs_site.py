"""The documentation site (`docs/`, `mkdocs.yml`): it builds with `mkdocs build --strict` (no
warning, no broken link or anchor), its generated parts are filled in from the code, and a part
whose hand-written half no longer matches the code fails the build instead of publishing it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funke.deploy import sitedocs

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, cwd=config.parent, timeout=300)


def copy_of_site_sources(tmp_path: Path) -> Path:
    """mkdocs.yml and docs/ copied, so that a test can break a page without touching the checkout."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "mkdocs.yml"


def test_the_site_builds_strictly_with_every_generated_part(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("index.html")}
    assert not [name for name, html in pages.items() if "<!-- generated:" in html]
    assert not (site / "hooks.py").exists()
    # one figure from each generator, as the code has it
    assert "high-availability.zookeeper.client.session-timeout" in pages["configuration/index.html"]
    assert "RescaleJob" in pages["api/grpc/index.html"]
    assert "/jobs/{jid}/rescale" in pages["api/rest/index.html"]
    assert "funke_taskmanager_job_task_numRecordsIn" in pages["operations/monitoring/index.html"]
    assert pages["concepts/state-machines/index.html"].count('class="mermaid"') == len(sitedocs_sections())
    assert "usage: funke cluster start" in pages["cli/index.html"]


def sitedocs_sections() -> list[str]:
    from funke.deploy.docs import SECTIONS

    return list(SECTIONS)


@pytest.mark.parametrize("planted", [
    "[a page that is not there](concepts/nowhere.md)",
    "[an anchor that is not there](configuration.md#no-such-heading)",
    "<!-- generated: no-such-part -->",
])
def test_a_broken_link_or_an_unknown_part_fails_the_build(tmp_path: Path, planted: str) -> None:
    config = copy_of_site_sources(tmp_path)
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + f"\n{planted}\n")
    result = build(config, tmp_path / "site")
    assert result.returncode != 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert re.search(r"nowhere\.md|no-such-heading|no-such-part", output), output


def test_every_generated_part_the_pages_ask_for_renders() -> None:
    asked = {m.group(1) for page in (ROOT / "docs").rglob("*.md") for m in sitedocs.MARKER.finditer(page.read_text())}
    assert {"cluster-options", "grpc-services", "rest-endpoints", "cli", "metrics"} <= asked
    assert {f"diagram:{s}" for s in sitedocs_sections()} <= asked
    for name in asked:
        assert sitedocs.render(name).strip(), name


def test_a_configuration_key_the_code_accepts_but_the_docs_do_not_describe_fails(monkeypatch) -> None:
    described = tuple(o for o in sitedocs.CLUSTER_OPTIONS if o.key != "slot.request.timeout")
    monkeypatch.setattr(sitedocs, "CLUSTER_OPTIONS", described)
    with pytest.raises(sitedocs.DocsError, match="slot.request.timeout"):
        sitedocs.cluster_options()


def test_a_described_key_the_code_does_not_accept_fails(monkeypatch) -> None:
    stale = sitedocs.CLUSTER_OPTIONS + (sitedocs.ClusterOption("jobmanager.gone", "a key that was removed"),)
    monkeypatch.setattr(sitedocs, "CLUSTER_OPTIONS", stale)
    with pytest.raises(sitedocs.DocsError, match="jobmanager.gone"):
        sitedocs.cluster_options()


def test_the_accepted_keys_are_the_ones_parse_configuration_takes() -> None:
    from funke.common.configuration import ConfigurationError, parse_configuration

    for key in sitedocs.accepted_cluster_keys():
        if key.endswith("*"):
            continue
        try:
            parse_configuration({key: ""})
        except ConfigurationError as exc:
            assert not any(p == f"unknown key {key!r}" for p in exc.problems), key
    with pytest.raises(ConfigurationError, match="unknown key"):
        parse_configuration({"no.such.key": "1"})


def test_a_rest_route_without_a_description_fails(monkeypatch) -> None:
    endpoints = {k: v for k, v in sitedocs.REST_ENDPOINTS.items() if k != ("POST", "/jobs/{jid}/rescale")}
    monkeypatch.setattr(sitedocs, "REST_ENDPOINTS", endpoints)
    with pytest.raises(sitedocs.DocsError, match="rescale"):
        sitedocs.rest_endpoints()


def test_the_grpc_part_lists_every_method_of_the_descriptors() -> None:
    from funke.v1 import cluster_pb2, jobmanager_pb2

    text = sitedocs.grpc_services()
    for module in (jobmanager_pb2, cluster_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                assert f"| `{method.name}` |" in text, method.full_name


def test_proto_comments_are_read_per_rpc_and_per_field() -> None:
    parsed = sitedocs.parse_proto(
        "// header\n\nsyntax = \"proto3\";\n\nservice S {\n  // does a thing\n  rpc Do(A) returns (B);\n}\n\n"
        "// an A\nmessage A {\n  repeated string x = 1;  // the x\n  oneof o {\n    int32 y = 2;\n  }\n}\n"
        "message C {\n  message Empty {}\n  map<string, int32> z = 1;\n}\n")
    assert parsed.header == "header"
    assert parsed.rpc_comments == {"S.Do": "does a thing"}
    assert parsed.messages["A"].comment == "an A"
    assert [(f.name, f.type, f.comment) for f in parsed.messages["A"].fields] == [
        ("x", "repeated string", "the x"), ("y", "int32", "")]
    assert parsed.messages["Empty"].fields == []
    assert [(f.name, f.type) for f in parsed.messages["C"].fields] == [("z", "map<string, int32>")]


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs' toc make it: lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_links(markdown: str, base: Path) -> list[str]:
    """The relative links of `markdown` whose file does not exist under `base`, or whose anchor
    no heading of that Markdown file makes."""
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of the same page
        path, _, anchor = target.partition("#")
        file = (base / path).resolve()
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", file.read_text(), flags=re.S), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    return broken


def test_the_readmes_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(LINK.findall(readme)) > 20
    assert broken_links(readme, ROOT) == []
    # the check itself sees a missing file and a missing anchor
    planted = "[a](docs/nowhere.md) [b](docs/limits.md#no-such-heading) [c](docs/limits.md) [d](https://x.org/y)"
    assert broken_links(planted, ROOT) == ["docs/nowhere.md", "docs/limits.md#no-such-heading"]


def test_the_readme_links_every_page_of_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert sorted(pages - linked) == []


def test_the_benchmark_table_goes_between_the_markers_of_the_benchmarks_page(tmp_path: Path) -> None:
    from tests.benchmarks.run_all import DOCS_PAGE, update_docs

    assert DOCS_PAGE == ROOT / "docs" / "benchmarks.md"
    page = tmp_path / "benchmarks.md"
    page.write_text(DOCS_PAGE.read_text())
    before, _, rest = page.read_text().partition("<!-- benchmarks:begin -->")
    after = rest.partition("<!-- benchmarks:end -->")[2]
    update_docs(page, "2 cores", "2030-01-02", "| measurement | funke |\n| --- | --- |\n| x | 1 ms |")
    assert page.read_text() == (f"{before}<!-- benchmarks:begin -->\nMeasured on 2 cores, 2030-01-02, with "
                                f"`python3 deploy/dev.py bench`:\n\n| measurement | funke |\n| --- | --- |\n| x | 1 ms |"
                                f"\n<!-- benchmarks:end -->{after}")
    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text("# Benchmarks\n")
    with pytest.raises(SystemExit, match="no <!-- benchmarks:begin/end --> markers"):
        update_docs(unmarked, "2 cores", "2030-01-02", "| x |")
