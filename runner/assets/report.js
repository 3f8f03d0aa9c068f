// Inlined into reports/index.html by runner/html.py: the client-side filters.
// Elements with data-cell="<i>" belong to cell i of the JSON in #cells-data; a cell is
// shown when, for every facet, its value (one of its values, for a list: a cell's dtypes)
// is checked. Rows with data-dtype="<dtype>" are about one case dtype and are shown only
// when that dtype is checked. Identical-bits verdicts are recomputed over the cells shown.
"use strict";
(function () {
  const cells = JSON.parse(document.getElementById("cells-data").textContent);
  const form = document.getElementById("filters");
  const boxes = Array.from(form.querySelectorAll("input[type=checkbox]"));
  const dims = Array.from(new Set(boxes.map((b) => b.dataset.dim)));
  const tagged = Array.from(document.querySelectorAll("[data-cell]"));
  const typed = Array.from(document.querySelectorAll("[data-dtype]"));
  const acrossRows = Array.from(document.querySelectorAll("tr[data-across]"));
  const tables = Array.from(document.querySelectorAll("table.data"));

  function allowedValues() {
    const allowed = {};
    dims.forEach((d) => { allowed[d] = new Set(); });
    boxes.forEach((b) => { if (b.checked) { allowed[b.dataset.dim].add(b.value); } });
    return allowed;
  }

  function shownCells(allowed) {
    const any = (d, v) => (Array.isArray(v) ? v.some((x) => allowed[d].has(x))
                                            : allowed[d].has(v));
    return cells.map((c) => dims.every((d) => any(d, c[d])));
  }

  const toggles = Array.from(document.querySelectorAll("input.only-variants"));

  function verdict(tr, shown) {
    if (tr.dataset.void === "1") { return; }
    const cell = tr.querySelector("td.verdict");
    const marked = Array.from(tr.querySelectorAll("td[data-g]"))
      .filter((td) => shown[Number(td.dataset.cell)]);
    const n = marked.length;
    const groups = new Set(marked.map((td) => td.dataset.g)).size;
    let text = "no cell shown";
    let kind = "absent";
    if (n === 1) { text = "1 cell only"; kind = "none"; }
    else if (n > 1 && groups === 1) { text = "identical (" + n + " cells)"; kind = "eq"; }
    else if (n > 1) { text = groups + " variants (" + n + " cells)"; kind = "diff"; }
    if (cell.dataset.static === "1" && n > 1) { kind = "eq"; text = "agree"; }
    cell.textContent = text;
    cell.className = "verdict k-" + kind;
  }

  function onlyVariants(offDtype) {
    toggles.forEach((box) => {
      const table = document.getElementById(box.dataset.table);
      Array.from(table.tBodies[0].rows).forEach((tr) => {
        const kind = tr.querySelector("td.verdict").className;
        tr.hidden = (box.checked && !/k-(diff|void)/.test(kind)) || offDtype(tr);
      });
    });
  }

  function apply() {
    const allowed = allowedValues();
    const shown = shownCells(allowed);
    const offDtype = (el) => Boolean(allowed.dtype && el.dataset.dtype !== undefined
                                     && !allowed.dtype.has(el.dataset.dtype));
    tagged.forEach((el) => { el.hidden = !shown[Number(el.dataset.cell)] || offDtype(el); });
    typed.forEach((el) => { if (el.dataset.cell === undefined) { el.hidden = offDtype(el); } });
    acrossRows.forEach((tr) => verdict(tr, shown));
    onlyVariants(offDtype);
    tables.forEach((t) => {
      const rows = t.tBodies.length ? Array.from(t.tBodies[0].rows) : [];
      const out = document.getElementById("count-" + t.id);
      if (out) {
        const visible = rows.filter((r) => !r.hidden).length;
        out.textContent = visible + " of " + rows.length + " rows shown";
      }
    });
    const n = shown.filter(Boolean).length;
    document.getElementById("shown").textContent = n + " of " + cells.length + " cells shown";
  }

  boxes.forEach((b) => b.addEventListener("change", apply));
  toggles.forEach((b) => b.addEventListener("change", apply));
  form.querySelectorAll("button.only").forEach((button) => {
    button.addEventListener("click", () => {
      boxes.forEach((b) => {
        if (b.dataset.dim === button.dataset.dim) { b.checked = b.value === button.value; }
      });
      apply();
    });
  });
  document.getElementById("reset").addEventListener("click", () => {
    boxes.forEach((b) => { b.checked = true; });
    apply();
  });
  apply();
})();
