// Inlined into reports/index.html by runner/html.py: the filters, which take what people type.
// Each box (GPU, stack, mode, pair) holds text: a part of a name, in any case; commas separate
// alternatives ("h200, b200"); an empty box allows everything. Headline columns
// (data-col="<n>", facets in #cells-data .columns), the per-op grids' columns (data-gcol,
// facets in .gcolumns) and rows (data-pair) are hidden when they
// do not match; so are rows of other tables that belong to one cell (data-cell="<i>").
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("cells-data").textContent);
  const form = document.getElementById("filters");
  const boxes = Array.from(form.querySelectorAll("input[data-dim]"));
  const cols = Array.from(document.querySelectorAll("[data-col]"));
  const gcols = Array.from(document.querySelectorAll("[data-gcol]"));
  const pairs = Array.from(document.querySelectorAll("tr[data-pair]"));
  const tagged = Array.from(document.querySelectorAll("[data-cell]"));
  const tables = Array.from(document.querySelectorAll("table.data"));

  function wanted() {
    const out = {};
    boxes.forEach((b) => {
      out[b.dataset.dim] = b.value.split(",").map((s) => s.trim().toLowerCase())
        .filter((s) => s.length > 0);
    });
    return out;
  }

  function fits(parts, value) {
    if (!parts || parts.length === 0) { return true; }
    const v = String(value).toLowerCase();
    return parts.some((p) => v.includes(p));
  }

  function keeps(w, facets) {
    return ["gpu", "stack", "mode"].every((d) => fits(w[d], facets[d]));
  }

  function apply() {
    const w = wanted();
    const shownCols = data.columns.map((c) => keeps(w, c));
    cols.forEach((el) => { el.hidden = !shownCols[Number(el.dataset.col)]; });
    gcols.forEach((el) => { el.hidden = !keeps(w, data.gcolumns[el.dataset.gcol]); });
    pairs.forEach((tr) => { tr.hidden = !fits(w.pair, tr.dataset.pair); });
    const shownCells = data.cells.map((c) => keeps(w, c));
    tagged.forEach((el) => { el.hidden = !shownCells[Number(el.dataset.cell)]; });
    tables.forEach((t) => {
      const out = document.getElementById("count-" + t.id);
      if (!out || !t.tBodies.length) { return; }
      const rows = Array.from(t.tBodies[0].rows);
      const visible = rows.filter((r) => !r.hidden).length;
      let text = visible + " of " + rows.length + " rows shown";
      if (t.id === "t-headline") {
        text += ", " + shownCols.filter(Boolean).length + " of " + shownCols.length + " columns";
      }
      out.textContent = text;
    });
    const n = shownCells.filter(Boolean).length;
    document.getElementById("shown").textContent = n + " of " + data.cells.length +
      " cells shown";
  }

  boxes.forEach((b) => b.addEventListener("input", apply));
  document.getElementById("reset").addEventListener("click", () => {
    boxes.forEach((b) => { b.value = ""; });
    apply();
  });
  apply();
})();
