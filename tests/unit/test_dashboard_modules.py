"""The dashboard is ES modules the browser loads itself (no build step): app.js imports the rest,
so every module it reaches must be a file the JobManager serves, without a token, as JavaScript.
A module added to jobmanager/web/ is served with no change to rest.py; one imported but missing,
or one nothing imports, fails here rather than in a browser. (tests/integration/test_dashboard.py
runs them in Chromium.)"""

from __future__ import annotations

import re
from pathlib import Path

from funke.jobmanager import rest

WEB = Path(__file__).resolve().parents[2] / "jobmanager" / "web"
IMPORT = re.compile(r"^import \{[^}]*\} from '\./([\w.-]+)';$", re.M)


def imports() -> dict[str, list[str]]:
    """Module file name -> the file names it imports (only relative imports of siblings exist)."""
    found = {}
    for path in sorted(WEB.glob("*.js")):
        text = path.read_text()
        found[path.name] = IMPORT.findall(text)
        other = [line for line in text.splitlines() if line.startswith(("import ", "export *", "export {"))
                 and not IMPORT.match(line) and not line.startswith("import {")]
        assert not other, f"{path.name}: an import the check above cannot read: {other}"
    return found


def test_every_module_app_js_reaches_is_served_publicly_as_javascript():
    graph = imports()
    reached, todo = set(), ["app.js"]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        assert name in graph, f"a module imports {name}, which is not in jobmanager/web/"
        todo.extend(graph[name])
    assert reached == set(graph), f"modules nothing imports: {sorted(set(graph) - reached)}"
    for name in reached:
        assert rest._STATIC.get(name) == "application/javascript", name
        assert f"/web/{name}" in rest._PUBLIC, name  # the page loads them before anyone logs in


def test_the_modules_import_one_another_without_a_circle():
    graph = imports()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join(path + (name,))}"
        if name in done:
            return
        for imported in graph[name]:
            visit(imported, path + (name,))
        done.add(name)

    visit("app.js", ())


def test_only_the_scripts_and_the_style_sheet_are_served():
    assert set(rest._STATIC) == {p.name for p in WEB.glob("*.js")} | {"style.css"}
    assert rest._STATIC["style.css"] == "text/css"


def test_no_module_writes_html():
    for path in WEB.glob("*.js"):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith(("*", "/*")))
        assert "innerHTML" not in code and "insertAdjacentHTML" not in code, path.name
