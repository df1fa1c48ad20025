"""Every notebook of the site runs top to bottom (on the CPU through Triton's interpreter, or on a GPU),
and whatever outputs are saved in it came from a GPU run."""

from __future__ import annotations

import nbformat
import pytest
import torch

from sitetools import load_tool

run_notebooks = load_tool("run_notebooks")
NOTEBOOKS = run_notebooks.notebooks()
ON_GPU = torch.cuda.is_available()


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS if p.name == "softmax-from-scratch.ipynb"], NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    env = None if ON_GPU else {"TRITON_INTERPRET": "1"}
    nb = run_notebooks.execute(path, timeout=300, env=env)
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.get("output_type") == "error"]
    assert not errors
    printed = run_notebooks.output_text(nb)
    if ON_GPU:
        assert run_notebooks.GPU_MARKER in printed
    else:
        # On the CPU the notebook must say, in its output, that its timings are no evidence.
        assert "cpu-interpreter: not performance evidence" in printed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_outputs_come_from_a_gpu_run(path):
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    if not any(cell.outputs for cell in code):
        return  # cleared: nothing is published as if it were a result
    printed = run_notebooks.output_text(nb)
    assert run_notebooks.GPU_MARKER in printed, f"{path.name} keeps outputs that did not come from a GPU run"
    assert run_notebooks.CPU_MARKER not in printed, f"{path.name} keeps outputs of a CPU-interpreter run"
    assert all(cell.outputs or not cell.source.strip() for cell in code), f"{path.name}: some cells never ran"


def test_notebooks_are_valid_and_need_no_network():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        source = "\n".join(cell.source for cell in nb.cells)
        assert "pip install" not in source and "http://" not in source and "https://" not in source, path


@pytest.mark.skipif(ON_GPU, reason="on a GPU the script may save outputs")
def test_outputs_are_never_saved_from_a_cpu_run(capsys):
    assert run_notebooks.main([]) == 2
    assert run_notebooks.main(["--allow-cpu"]) == 2
    assert "refusing to save" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# The build marks outputs that are missing or were made by other code (lab.publish.jupyter)
# --------------------------------------------------------------------------------------------------------


def _notebook(*sources, outputs=True):
    nb = nbformat.v4.new_notebook()
    for source in sources:
        cell = nbformat.v4.new_code_cell(source)
        if outputs:
            cell.outputs = [nbformat.v4.new_output("stream", text="device: cuda\n")]
        nb.cells.append(cell)
    return nb


def test_outputs_stamped_with_the_code_that_made_them_are_fresh_until_the_code_changes():
    from lab.publish import jupyter

    nb = _notebook("x = 1", "print(x)")
    assert jupyter.outputs_state(nb) == jupyter.MISSING  # outputs, but no stamp: nobody says which code made them
    jupyter.stamp(nb, "NVIDIA H100 80GB HBM3", "2026-11-26T10:00:00Z")
    assert jupyter.outputs_state(nb) == jupyter.FRESH and jupyter.outputs_notice(nb) is None
    nb.cells[1].source = "print(x + 1)"
    assert jupyter.outputs_state(nb) == jupyter.STALE
    notice = jupyter.outputs_notice(nb)
    assert "earlier version" in notice and "NVIDIA H100 80GB HBM3" in notice and "2026-11-26T10:00:00Z" in notice


def test_a_notebook_without_outputs_is_marked_and_markup_in_a_stamp_is_escaped():
    from lab.publish import jupyter

    bare = _notebook("x = 1", outputs=False)
    assert jupyter.outputs_state(bare) == jupyter.MISSING and "without results" in jupyter.outputs_notice(bare)
    nb = _notebook("x = 1")
    jupyter.stamp(nb, "<b>GPU</b>", "now")
    nb.cells[0].source = "x = 2"
    assert "&lt;b&gt;GPU&lt;/b&gt;" in jupyter.outputs_notice(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_published_outputs_are_the_current_codes_or_the_page_says_so(path):
    from lab.publish import jupyter

    nb = nbformat.read(path, as_version=4)
    state = jupyter.outputs_state(nb)
    assert (jupyter.outputs_notice(nb) is None) == (state == jupyter.FRESH)
