"""nbgrader preprocessors of the course (wired in nbgrader_config.py).

`HideTestTracebacks` runs when feedback is generated: in graded test cells it
replaces each error's traceback (whose frames quote the cell's source lines,
hidden tests included) by the error's type and message, which is what a
student needs: the checks' messages say which rank, tensor and element failed.
`WrapOutputLines` (feedback too) makes long output lines wrap at the page's
edge instead of being cut off there (nbconvert's `pre` does not wrap).
`LimitOutputChars` caps every output's text (autograde).
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


class LimitOutputChars(NbGraderPreprocessor):
    """Cap every output's text at `max_chars` characters (nbgrader's LimitOutput counts lines: one 50 MB
    line would pass it and end up in the notebook and its feedback)."""

    from traitlets import Integer as _Integer

    max_chars = _Integer(20_000, help="characters kept of each output").tag(config=True)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n... [{len(text) - self.max_chars} more characters not kept]\n"

    def preprocess_cell(self, cell, resources, cell_index):
        for output in cell.get("outputs", []):
            if "text" in output:
                text = output["text"] if isinstance(output["text"], str) else "".join(output["text"])
                output["text"] = self._cap(text)
            for mime, value in list(output.get("data", {}).items()):
                if mime.startswith("text/") and isinstance(value, (str, list)):
                    output["data"][mime] = self._cap(value if isinstance(value, str) else "".join(value))
            if output.get("output_type") == "error":
                output["evalue"] = self._cap(str(output.get("evalue", "")))
                output["traceback"] = [self._cap(line) for line in output.get("traceback", [])][:200]
        return cell, resources


# Outputs (and tracebacks) wrap at the page's edge; a word longer than a line (a path, a tensor) breaks anywhere.
WRAP_CSS = """
div.output_area pre, div.output_subarea pre, div.output_text pre, div.jp-OutputArea-output pre {
    white-space: pre-wrap;
    overflow-wrap: anywhere;
    word-break: break-word;
}
"""


class WrapOutputLines(NbGraderPreprocessor):
    """Feedback HTML: long message lines wrap instead of running off the right edge (a CSS rule, inlined in the
    page by nbgrader's feedback template, which writes every `resources["inlining"]["css"]` entry)."""

    def preprocess(self, nb, resources):
        inlining = resources.setdefault("inlining", {})
        inlining["css"] = list(inlining.get("css", [])) + [WRAP_CSS]
        return nb, resources
