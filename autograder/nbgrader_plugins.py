"""nbgrader preprocessors of the course (wired in nbgrader_config.py).

`HideTestTracebacks` runs when feedback is generated: in graded test cells it
replaces each error's traceback (whose frames quote the cell's source lines,
hidden tests included) by the error's type and message, which is what a
student needs: the checks' messages say which rank, tensor and element failed.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor


class HideTestTracebacks(NbGraderPreprocessor):
    """In graded test cells, keep `ename: evalue` of each error, drop the source-quoting frames."""

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
