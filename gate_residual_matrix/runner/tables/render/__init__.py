"""The renderers: built tables (:class:`runner.tables.model.build.Tables`) laid out, one module
per format. Each reads the model only; no renderer imports another format's module.

* ``markdown``: Markdown primitives and every table in one document; ``pages``: the Markdown
  files of ``reports/`` (README.md, cells/, ab.md);
* ``html``: ``index.html``, one self-contained page;
* ``summary``: ``summary.csv`` and ``summary.json``;
* ``plots``: SVG pictures (matplotlib);
* ``links``: the page names both the Markdown and the HTML link to.
"""
