// RunPicker's table view (anywidget ESM): draws the one page Python sends and reports clicks.
// Filtering, sorting, paging and the selection itself are decided in Python (run_picker.py);
// this file only renders `rows`/`columns`/`page_selected` and sends {event: ...} messages back.
// The selection column and the first data column stay pinned when the table scrolls sideways
// (table.css), and a redraw keeps the scroll position, so sorting a far column keeps it in view.
// Keyboard: Tab reaches the headers (Enter or Space sorts) and the rows (Space toggles a row,
// Enter picks it alone, ↑ ↓ move between rows); a redraw keeps the focus where it was.

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "mnb-table";
  root.dataset.view = `${Date.now()}-${Math.random()}`; // tells one view of the table from the next
  el.appendChild(root);

  function send(msg) {
    model.send(msg);
  }

  function draw() {
    const columns = model.get("columns");
    const rows = model.get("rows");
    const selected = new Set(model.get("page_selected"));
    const sort = model.get("sort") || {};
    const page = model.get("page");
    const nPages = model.get("n_pages");
    const scrollLeft = root.scrollLeft;
    const scrollTop = root.scrollTop;
    // keyboard focus inside the table (a row, its checkbox, a header) is given back after the
    // redraw, so Space on a row or Enter on a header keeps the user where they were
    const active = root.contains(document.activeElement) ? document.activeElement : null;
    const refocus = active && {
      key: active.closest("tr[data-key]")?.dataset.key,
      column: active.closest("th[data-column]")?.dataset.column,
      box: active.tagName === "INPUT",
    };
    root.replaceChildren();

    const table = document.createElement("table");
    const thead = table.createTHead();
    const hr = thead.insertRow();
    const corner = document.createElement("th");
    corner.className = "mnb-pin mnb-check";
    hr.appendChild(corner); // checkbox column
    columns.forEach((c, i) => {
      const th = document.createElement("th");
      th.textContent = c + (sort.column === c ? (sort.ascending ? " ▲" : " ▼") : "");
      th.title = "sort by " + c + " (Enter or Space)";
      th.dataset.column = c;
      th.tabIndex = 0;
      th.setAttribute("aria-sort", sort.column === c ? (sort.ascending ? "ascending" : "descending") : "none");
      if (i === 0) th.classList.add("mnb-pin", "mnb-first");
      th.addEventListener("click", () => send({ event: "sort", column: c }));
      th.addEventListener("keydown", (e) => {
        if (e.key !== "Enter" && e.key !== " ") return;
        e.preventDefault(); // Space would scroll the page
        send({ event: "sort", column: c });
      });
      hr.appendChild(th);
    });
    const tbody = table.createTBody();
    for (const r of rows) {
      const key = r.__key__;
      const full = r.__full__ || {};
      const tr = tbody.insertRow();
      tr.dataset.key = key;
      tr.tabIndex = 0; // Tab reaches the rows; Space toggles one, ↑ ↓ move between them
      tr.setAttribute("aria-selected", selected.has(key) ? "true" : "false");
      if (selected.has(key)) tr.classList.add("mnb-selected");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = selected.has(key);
      box.title = "select (shift: a range)";
      box.addEventListener("click", (e) => {
        e.stopPropagation(); // the checkbox toggles this row only (or a range with shift)
        e.preventDefault(); // Python's reply redraws the box
        send({ event: "click", key, shift: e.shiftKey, toggle: true });
      });
      const td0 = tr.insertCell();
      td0.className = "mnb-pin mnb-check";
      td0.appendChild(box);
      columns.forEach((c, i) => {
        const td = tr.insertCell();
        const text = r[c] ?? "";
        td.textContent = text;
        td.dataset.column = c;
        if (full[c] !== undefined || text.length > 12) td.title = full[c] ?? text; // the whole text on hover
        if (i === 0) td.classList.add("mnb-pin", "mnb-first");
      });
      tr.addEventListener("mousedown", (e) => {
        if (e.shiftKey) e.preventDefault(); // no text selection on shift-click
      });
      tr.addEventListener("click", (e) => {
        send({ event: "click", key, shift: e.shiftKey, toggle: e.ctrlKey || e.metaKey });
      });
      tr.addEventListener("keydown", (e) => {
        if (e.target !== tr) return; // the checkbox handles its own Space
        if (e.key === " " || e.key === "Enter") {
          e.preventDefault(); // Space would scroll the page
          send({ event: "click", key, shift: e.shiftKey, toggle: e.key === " " || e.ctrlKey || e.metaKey });
        } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
          const next = e.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
          if (next && next.dataset.key !== undefined) {
            e.preventDefault();
            next.focus();
          }
        }
      });
    }
    if (rows.length === 0) {
      const tr = tbody.insertRow();
      const td = tr.insertCell();
      td.colSpan = columns.length + 1;
      td.className = "mnb-empty";
      td.textContent = "no runs match the filters";
    }
    root.appendChild(table);
    if (refocus) {
      let target = null;
      if (refocus.key !== undefined) {
        const row = [...table.querySelectorAll("tr[data-key]")].find((r) => r.dataset.key === refocus.key);
        target = row && (refocus.box ? row.querySelector("input") : row);
      } else if (refocus.column !== undefined) {
        target = [...table.querySelectorAll("th[data-column]")].find((h) => h.dataset.column === refocus.column);
      }
      if (target) target.focus({ preventScroll: true });
    }
    // the first data column is pinned right after the checkbox column, however wide that renders
    table.style.setProperty("--mnb-pin-left", `${corner.getBoundingClientRect().width}px`);
    root.scrollLeft = scrollLeft; // a redraw (sort, page, click) keeps the view where it was
    root.scrollTop = scrollTop;

    const pager = document.createElement("div");
    pager.className = "mnb-pager";
    const button = (label, target, title) => {
      const b = document.createElement("button");
      b.textContent = label;
      b.title = title;
      b.disabled = target < 0 || target >= nPages || target === page;
      b.addEventListener("click", () => send({ event: "page", page: target }));
      pager.appendChild(b);
    };
    button("«", 0, "first page");
    button("‹", page - 1, "previous page");
    const info = document.createElement("span");
    info.className = "mnb-page-info";
    info.textContent = `page ${page + 1} of ${nPages}`;
    pager.appendChild(info);
    button("›", page + 1, "next page");
    button("»", nPages - 1, "last page");
    pagerBox.replaceChildren(pager);
  }

  const pagerBox = document.createElement("div");
  el.appendChild(pagerBox);

  // Keep the scroll position in the model, so a re-created view (JupyterLab makes a new one when
  // the output's static fallback is updated) opens where this one was.
  let saving = null;
  root.addEventListener("scroll", () => {
    if (saving) return;
    saving = setTimeout(() => {
      saving = null;
      model.set("scroll", { left: root.scrollLeft, top: root.scrollTop });
      model.save_changes();
    }, 150);
  });

  // One Python update changes several traits at once: draw once for all of them.
  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    queueMicrotask(() => {
      pending = false;
      draw();
    });
  }
  draw();
  const restore = () => {
    const at = model.get("scroll") || {};
    root.scrollLeft = at.left || 0;
    root.scrollTop = at.top || 0;
  };
  restore();
  requestAnimationFrame(restore); // once the view is in the page and has its size
  for (const name of ["rows", "columns", "page_selected", "sort", "page", "n_pages"]) {
    model.on(`change:${name}`, schedule);
  }
}

export default { render };
