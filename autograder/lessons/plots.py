"""Pictures for the notebooks: matplotlib figures built without pyplot, shown as PNG images.

    from autograder.lessons.plots import new_figure, picture
    fig, ax = new_figure(figsize=(7, 3))
    ax.bar(["a", "b"], [1, 2])
    return picture(fig)          # the last expression of a cell: an image in JupyterLab and in feedback HTML

A figure made with `matplotlib.figure.Figure` (no pyplot, no global state, no
GUI backend) is not displayed by IPython on its own: it shows as the text
`<Figure size ...>`. `picture` renders it to PNG once and returns an object
that every front end shows as an image (JupyterLab, nbconvert's HTML, the
feedback nbgrader generates), and that a test can inspect (`.png`).
"""

from __future__ import annotations

import io

__all__ = ["new_figure", "picture", "Picture", "matplotlib_missing"]


def matplotlib_missing() -> str | None:
    """None when matplotlib imports; otherwise the sentence to print instead of a picture."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("matplotlib is not installed, so there is no picture here; it is a dependency of the course "
                "package: reinstall it (the README's student steps) and restart the kernel.")
    return None


def new_figure(figsize=(8, 3.5), nrows: int = 1, ncols: int = 1, **subplot_kw):
    """(figure, axes) without pyplot; `axes` as `Figure.subplots` returns them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


class Picture:
    """A rendered figure: shown as a PNG by IPython (`_repr_png_`), kept as bytes in `.png`."""

    def __init__(self, fig, *, dpi: int = 100):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        self.png = buf.getvalue()
        self.figure = fig
        self.title = fig.axes[0].get_title() if fig.axes else ""

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:  # what a plain Python console prints
        return f"<Picture {self.title!r}: {len(self.png)} bytes of PNG>"


def picture(fig) -> Picture:
    """Render `fig` (a matplotlib Figure) to a `Picture` that displays as an image."""
    return Picture(fig)
