"""Every notebook runs top to bottom in a real Jupyter kernel, offline, with nothing to edit; it is
committed without outputs, uses only the public API, and leaves no temporary folder behind. Executed,
it reads as its runs ended: every progress bar it saves says 100%."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

import batchsum

nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))

# The public API: the package's ``__all__``, and the modules the README has users import by name.
PUBLIC_MODULES = {"batchsum.local", "batchsum.polars", "batchsum.dask", "batchsum.spark"}
PUBLIC_NAMES = {*batchsum.__all__, "__version__", *(module.split(".")[1] for module in PUBLIC_MODULES)}

BAR = re.compile(r"(\d+)%\|")  # a tqdm line: "summarize: 100%|##########| 16/16 [00:05<00:00, ...]"
PROGRESS_MODELS = {"IntProgressModel", "FloatProgressModel"}  # tqdm's bar widget, the app's progress


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def private_uses(source):
    """What ``source`` uses of batchsum beyond the public API: private modules imported or named,
    and names the package does not export."""
    tree = ast.parse(source)
    package = {"batchsum"}  # the names bound to the package
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            package.update(alias.asname for alias in node.names if alias.name == "batchsum" and alias.asname)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {alias.name}"
                for alias in node.names
                if alias.name.startswith("batchsum.") and alias.name not in PUBLIC_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "batchsum":
            if node.module not in ("batchsum", *PUBLIC_MODULES):
                found.append(f"from {node.module} import ...")
            for alias in node.names:
                if (node.module == "batchsum" and alias.name not in PUBLIC_NAMES) or alias.name.startswith("_"):
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in package:
            if node.attr not in PUBLIC_NAMES:
                found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # python -m batchsum.cli, import_module
            if re.fullmatch(r"batchsum(\.\w+)+", node.value) and node.value not in PUBLIC_MODULES:
                found.append(repr(node.value))
    return found


def outputs_text(notebook):
    """Every output's text as a reader sees it: streams (a line shows its part after the last carriage
    return), text/plain (a bar widget's text among them), tracebacks."""
    for cell in code_cells(notebook):
        for output in cell.outputs:
            if output.output_type == "stream":
                yield "\n".join(line.rsplit("\r", 1)[-1] for line in output.text.split("\n"))
            elif output.output_type == "error":
                yield "\n".join(output.traceback)
            else:
                yield output.get("data", {}).get("text/plain", "")


def progress_widgets(notebook):
    """(value, max) of every progress widget in the widget state the executed notebook saved."""
    state = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {}).values()
    return [(m["state"]["value"], m["state"]["max"]) for m in models if m["model_name"] in PROGRESS_MODELS]


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "batch-parquet.ipynb", "widget.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_is_committed_without_outputs(path):
    cells = code_cells(nbformat.read(path, as_version=4))
    assert all(not cell.outputs and cell.execution_count is None for cell in cells), (
        "commit notebooks with their outputs cleared"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_uses_only_the_public_api(path):
    notebook = nbformat.read(path, as_version=4)
    assert [use for cell in code_cells(notebook) for use in private_uses(cell.source)] == []


def test_private_uses_finds_what_is_not_public():
    source = (
        "import batchsum, batchsum.engine\n"
        "import batchsum as bs\n"
        "from batchsum.journal import Journal\n"
        "from batchsum import Run, _imports\n"
        "from batchsum.local import LocalService, _private\n"
        "bs.datasets.DatasetInput\n"
        "batchsum.RunSpec, batchsum.local.Faults, df.batchsum.summarize\n"
        "['python', '-m', 'batchsum.cli'], ['python', '-m', 'batchsum']\n"
    )
    assert sorted(private_uses(source)) == sorted(
        [
            "import batchsum.engine",
            "from batchsum.journal import ...",
            "from batchsum import _imports",
            "from batchsum.local import _private",
            "bs.datasets",
            "'batchsum.cli'",
        ]
    )


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def executed(request, tmp_path_factory):
    """The notebook executed once, with its widgets' state saved, and the folder that was its TMPDIR."""
    path = request.param
    notebook = nbformat.read(path, as_version=4)
    temporary = tmp_path_factory.mktemp(f"{path.stem}-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("BATCHSUM_API_KEY", raising=False)
        patch.setenv("TMPDIR", str(temporary))  # the kernel's, and what it runs
        client = nbclient.NotebookClient(
            notebook,
            timeout=180,
            kernel_name="python3",
            store_widget_state=True,
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()
    return path, notebook, temporary


@pytest.mark.slow
def test_the_notebook_runs_without_errors(executed):
    _, notebook, _ = executed
    errors = [o for cell in code_cells(notebook) for o in cell.outputs if o.output_type == "error"]
    assert not errors
    text = "\n".join(outputs_text(notebook))
    assert "was never awaited" not in text
    assert "Traceback" not in text


@pytest.mark.slow
def test_every_saved_progress_bar_reads_100_percent(executed):
    _, notebook, _ = executed
    lines = [bar for text in outputs_text(notebook) for bar in BAR.findall(text)]
    widgets = progress_widgets(notebook)
    assert lines or widgets, "every notebook runs a batch: its bar is saved"
    assert all(percent == "100" for percent in lines), lines
    assert all(value == maximum for value, maximum in widgets), widgets


@pytest.mark.slow
def test_the_notebook_leaves_no_temporary_folder(executed):
    _, _, temporary = executed
    left = [p.name for p in temporary.iterdir() if not p.name.startswith("ipykernel_")]  # the kernel's own
    assert left == []


@pytest.mark.slow
def test_the_parquet_run_is_interrupted_and_resumes_paying_for_nothing_twice(executed):
    path, notebook, _ = executed
    if path.stem != "batch-parquet":
        pytest.skip("the Parquet notebook's story")
    text = "\n".join(outputs_text(notebook))
    interrupted = re.search(r"interrupted: (\d+) rows were done \(\d+ ok\); (\d+) new answers kept", text)
    assert interrupted and "exit code 130" in text
    kept = int(interrupted[2])
    assert 0 < int(interrupted[1]) < 128
    assert re.search(rf"answers:\s+{kept} \(ok {kept}\)", text)  # batchsum journal
    resumed = re.search(r"wrote \S+: 128 rows: 104 ok, 24 skipped [^;]*, 0 failed; (\d+) sent", text)
    assert resumed and "exit code 0" in text
    assert kept + int(resumed[1]) == 96  # 96 distinct requests in all: none was paid for twice
    assert re.search(r"128 rows: 104 ok, 24 skipped [^;]*, 0 failed; 0 sent", text)  # the accessor, from the journal
    assert "the same summaries as the command's: True" in text
    assert "temporary folder removed: True" in text
