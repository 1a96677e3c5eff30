"""Every notebook runs top to bottom in a real Jupyter kernel, offline, with nothing to edit."""

from pathlib import Path

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "batch-parquet.ipynb", "widget.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_without_errors(path, monkeypatch):
    monkeypatch.delenv("BATCHSUM_API_KEY", raising=False)
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
        "commit notebooks with their outputs cleared"
    )
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"
    ]
    assert not errors
    text = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs)
    if path.stem == "batch-parquet":
        lines = text.splitlines()
        interrupted = next(line for line in lines if line.startswith("interrupted:"))
        kept = int(next(line for line in lines if line.endswith("answers kept in the journal")).split()[0])
        resumed = next(line for line in lines if line.startswith("128 rows:"))
        assert "0 failed" in resumed and interrupted
        sent_again = int(resumed.split("; ")[1].split()[0])
        assert kept + sent_again == 96  # 96 distinct requests in all: none was paid for twice
