"""The tables' model: reports read into typed cells, and every table built as display strings.

Nothing here renders a format or writes a file; :mod:`runner.tables.render` does, from what
:func:`runner.tables.model.build.build_tables` returns. Modules, from the ground up:

* ``values``: how one report value reads (``—`` for absent, numbers, times, CMPs, colours);
* ``table``: :class:`~runner.tables.model.table.Table` and its rows;
* ``cells``: one readable report as a :class:`~runner.tables.model.cells.CellReport`;
* ``filters``: which cells and implementations are shown (``--stack``, ``--impl``, ``--ab``);
* ``cases``: per-case facts (dtypes, order, rows per index value) and the ``--dtype`` filter;
* the tables: ``verdicts``, ``bits`` (per cell and across cells), ``seed``, ``ab``,
  ``accuracy``, ``inventory`` (cells, environment, implementations), ``kernel_only``,
  ``timings`` (and benchmarks), ``headline`` (the marks of the first table people read),
  ``summary_rows`` (the flat rows of summary.csv and summary.json);
* ``build``: :class:`~runner.tables.model.build.Tables`, all of them in order.
"""
