"""The design of record is docs/architecture.md, and the code is held to it: its folder tree names
every module once, its layer picture's arrows are exactly the imports between folders (module level,
under ``TYPE_CHECKING`` and inside functions alike), a ``_``-module is imported only inside its
package, and a module over 500 lines or a class over 150 stands there with the reason it is long.
Between modules: no import cycle, no sibling's private name, and every module imports alone. Inside
the package's folders each module has a name of its own, and ``pacing/`` stands in wings: its root
holds at most ``PACING_ROOT_MODULES`` modules, and the page's wing picture is exactly the imports
between them."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import batchsum

PACKAGE = Path(batchsum.__file__).resolve().parent
PAGE = PACKAGE.parent / "docs" / "architecture.md"
MODULE_LINES = 500
CLASS_LINES = 150
# The doors are the top package's own modules and the command line's folder: the front-ends a user
# meets, and the stable paths they type.
DOORS = "doors"
DOOR_FOLDERS = {"cli"}
# pacing/'s root holds the pacer and its pieces; the rest stands in its wings (its folders).
PACING = "pacing"
PACING_ROOT_MODULES = 12


def fenced(section: str) -> list[str]:
    """The lines of the first fenced block under the page's ``## <section>`` (or ``###``) heading."""
    text = PAGE.read_text()
    heading = re.search(rf"^#+ {re.escape(section)}$", text, re.M)
    assert heading, f"no heading '{section}' on the page"
    start = heading.start()
    block = re.search(r"^```\n(.*?)^```$", text[start:], re.S | re.M)
    assert block, f"no picture under '## {section}'"
    return block[1].splitlines()


def module_name(path: Path) -> str:
    return ".".join(["batchsum", *path.relative_to(PACKAGE).with_suffix("").parts]).removesuffix(".__init__")


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def folder(module: str) -> str:
    """The layer a module lives in: its folder under ``batchsum/``, or the doors."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] not in DOOR_FOLDERS:
        return parts[1]
    if len(parts) == 2 and MODULES[module].name == "__init__.py" and parts[1] not in DOOR_FOLDERS:
        return parts[1]  # a folder's own __init__
    return DOORS


def imports(path: Path) -> set[str]:
    """The batchsum modules ``path`` imports anywhere in its text: ``ast.walk`` reaches imports under
    ``TYPE_CHECKING`` and inside functions as well as at module level."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(candidate for candidate in candidates if candidate in MODULES)
    return found - {name}


EDGES = {(importer, imported) for importer, path in MODULES.items() for imported in imports(path)}


def picture(section: str = "The layers") -> dict[str, list[str]]:
    """A picture of the page, top floor first: each line ``part -> the parts it imports``."""
    arrows: dict[str, list[str]] = {}
    for line in fenced(section):
        if not line.strip():
            continue
        source, _, targets = line.partition("->")
        arrows[source.split()[0].rstrip("/")] = [target.rstrip("/") for target in targets.split()]
    return arrows


@pytest.mark.parametrize("section", ["The layers", "The wings of pacing/"])
def test_the_picture_is_drawn_top_down_and_every_arrow_points_down(section):
    arrows = picture(section)
    order = list(arrows)
    for source, targets in arrows.items():
        for target in targets:
            assert target in arrows, f"the picture's {source} -> {target}: {target} has no line of its own"
            assert order.index(target) > order.index(source), f"{source} -> {target} points up the picture"


def test_the_pictures_arrows_are_the_codes_imports_between_folders():
    arrows = picture()
    layers = {folder(module) for module in MODULES}
    assert layers == set(arrows), f"layers in the code {sorted(layers)}, in the picture {sorted(arrows)}"
    drawn = {(source, target) for source, targets in arrows.items() for target in targets}
    found = {(folder(a), folder(b)) for a, b in EDGES if folder(a) != folder(b)}
    by_edge = {edge: sorted(f"{a} -> {b}" for a, b in EDGES if (folder(a), folder(b)) == edge) for edge in found}
    undrawn = {edge: by_edge[edge] for edge in found - drawn}
    assert not undrawn, f"imports up the floors or sideways (not in the picture): {undrawn}"
    assert not drawn - found, f"arrows in the picture no import follows: {sorted(drawn - found)}"


def wing(module: str) -> str | None:
    """The wing of ``pacing/`` a module stands in: its folder there, ``pacing`` for the root (the
    pacer and its pieces), None outside ``pacing/``."""
    parts = module.split(".")
    if parts[:2] != ["batchsum", PACING]:
        return None
    if len(parts) > 3 or (len(parts) == 3 and MODULES[module].name == "__init__.py"):
        return parts[2]
    return PACING


def test_the_wing_pictures_arrows_are_the_codes_imports_between_pacings_wings():
    arrows = picture("The wings of pacing/")
    wings = {wing(module) for module in MODULES} - {None}
    assert wings == set(arrows), f"wings in the code {sorted(wings)}, in the picture {sorted(arrows)}"
    drawn = {(source, target) for source, targets in arrows.items() for target in targets}
    crossing = {(wing(a), wing(b), f"{a} -> {b}") for a, b in EDGES if wing(a) and wing(b) and wing(a) != wing(b)}
    found = {(a, b) for a, b, _ in crossing}
    undrawn = {edge: sorted(why for a, b, why in crossing if (a, b) == edge) for edge in found - drawn}
    assert not undrawn, f"imports between pacing's wings up the picture or sideways (not drawn): {undrawn}"
    assert not drawn - found, f"arrows in the wing picture no import follows: {sorted(drawn - found)}"


def test_pacings_root_holds_at_most_a_dozen_modules():
    root = sorted(path.name for path in (PACKAGE / PACING).glob("*.py"))
    assert len(root) <= PACING_ROOT_MODULES, f"pacing/ holds {len(root)} modules at its root: {root}"


def test_each_module_inside_the_folders_has_a_name_of_its_own():
    """Inside the package's folders one module per name (``_keys`` and ``keys`` are one name); the top
    package's own modules (the stable paths ``batchsum.errors``, ``batchsum.options`` ...) aside."""
    by_name: dict[str, list[str]] = {}
    for path in MODULES.values():
        if path.parent == PACKAGE or (path.stem.startswith("__") and path.stem.endswith("__")):
            continue
        by_name.setdefault(path.stem.lstrip("_"), []).append(path.relative_to(PACKAGE).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules sharing a name: {shared}"


def test_the_doors_import_no_other_door():
    """A front-end stands on the layers below, never on another front-end: the top package's
    ``_``-modules (what the doors share) and its ``__init__`` are the only doors a door imports. The
    top package itself lists the public API, which names every door's objects; ``python -m batchsum``
    (``__main__``) is the command line under its other name."""
    crossing = sorted(
        f"{a} -> {b}"
        for a, b in EDGES
        if folder(a) == folder(b) == DOORS
        and a not in ("batchsum", "batchsum.__main__")
        and b != "batchsum"
        and not b.split(".")[-1].startswith("_")
        and b.split(".")[:2] != a.split(".")[:2]  # inside one door's folder (cli/) is that door
    )
    assert not crossing, crossing


def test_a_private_module_is_imported_only_inside_its_package():
    for importer, imported in EDGES:
        if imported.split(".")[-1].startswith("_") and not imported.endswith("__init__"):
            package = imported.rsplit(".", 1)[0]
            assert importer.startswith(package + ".") or importer == package, f"{importer} imports {imported}"


def listed_modules() -> dict[str, str]:
    """The folder tree's entries: ``relative path -> its sentence``."""
    entries: dict[str, str] = {}
    folders: list[str] = []
    for line in fenced("The folders"):
        if not line.strip() or line.lstrip().startswith("batchsum/"):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        name, _, sentence = line.strip().partition(" ")
        del folders[max(depth - 1, 0) :]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
            continue
        path = "/".join([*folders, name])
        assert path not in entries, f"{path} listed twice"
        entries[path] = sentence.strip()
    return entries


def test_the_folder_tree_lists_every_module_once_with_a_sentence():
    entries = listed_modules()
    on_disk = {path.relative_to(PACKAGE).as_posix() for path in MODULES.values()}
    assert set(entries) == on_disk, f"missing {sorted(on_disk - set(entries))}, gone {sorted(set(entries) - on_disk)}"
    for path, sentence in entries.items():
        assert len(sentence.split()) >= 3, f"{path}: say what it holds"


def long_things() -> set[str]:
    """``path`` of each module over the module limit, ``path:Class`` of each class over the class limit."""
    found: set[str] = set()
    for path in MODULES.values():
        relative = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            found.add(relative)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > CLASS_LINES:
                found.add(f"{relative}:{node.name}")
    return found


def test_a_long_module_or_class_says_why_on_the_page_and_no_reason_outlives_its_length():
    reasons = set(re.findall(r"`([\w/.:]+)` is long because ", PAGE.read_text()))
    long = long_things()
    assert not long - reasons, (
        f"over {MODULE_LINES} lines a module or {CLASS_LINES} a class, no reason: {sorted(long - reasons)}"
    )
    assert not reasons - long, f"a reason on the page for what is no longer long: {sorted(reasons - long)}"


def test_no_module_imports_a_siblings_private_names():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{path.name} imports private {private} from {node.module}"


def test_the_import_graph_has_no_cycle():
    graph = {name: imports(path) for name, path in MODULES.items()}
    # A package's __init__ is its door (it re-exports, lazily where a cycle would follow): a module's
    # import of its own package, or of the top package, is not a dependency between ideas.
    graph = {
        name: {m for m in edges if m != "batchsum" and not name.startswith(m + ".")} for name, edges in graph.items()
    }
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*trail, name]))
        if state.get(name) == 2:
            return
        state[name] = 1
        for target in graph[name]:
            visit(target, [*trail, name])
        state[name] = 2

    for name in graph:
        visit(name, [])


@pytest.mark.slow
def test_each_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(name for name, path in MODULES.items() if path.name != "__main__.py")
    running = {
        name: subprocess.Popen([sys.executable, "-c", f"import {name}"], stderr=subprocess.PIPE) for name in names
    }
    for name, process in running.items():
        _, err = process.communicate(timeout=180)
        assert process.returncode == 0, f"{name}: {err.decode()[-500:]}"
