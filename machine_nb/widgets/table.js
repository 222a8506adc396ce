// RunPicker's table view (anywidget ESM): draws the one page Python sends and reports clicks.
// Filtering, sorting, paging and the selection itself are decided in Python (run_picker.py);
// this file only renders `rows`/`columns`/`page_selected` and sends {event: ...} messages back.

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "mnb-table";
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
    root.replaceChildren();

    const table = document.createElement("table");
    const thead = table.createTHead();
    const hr = thead.insertRow();
    hr.appendChild(document.createElement("th")); // checkbox column
    for (const c of columns) {
      const th = document.createElement("th");
      th.textContent = c + (sort.column === c ? (sort.ascending ? " ▲" : " ▼") : "");
      th.title = "sort by " + c;
      th.dataset.column = c;
      th.addEventListener("click", () => send({ event: "sort", column: c }));
      hr.appendChild(th);
    }
    const tbody = table.createTBody();
    for (const r of rows) {
      const key = r.__key__;
      const tr = tbody.insertRow();
      tr.dataset.key = key;
      if (selected.has(key)) tr.classList.add("mnb-selected");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = selected.has(key);
      box.addEventListener("click", (e) => {
        e.stopPropagation(); // the checkbox toggles this row only (or a range with shift)
        e.preventDefault(); // Python's reply redraws the box
        send({ event: "click", key, shift: e.shiftKey, toggle: true });
      });
      const td0 = tr.insertCell();
      td0.appendChild(box);
      for (const c of columns) {
        const td = tr.insertCell();
        td.textContent = r[c] ?? "";
      }
      tr.addEventListener("mousedown", (e) => {
        if (e.shiftKey) e.preventDefault(); // no text selection on shift-click
      });
      tr.addEventListener("click", (e) => {
        send({ event: "click", key, shift: e.shiftKey, toggle: e.ctrlKey || e.metaKey });
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
    root.appendChild(pager);
  }

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
  for (const name of ["rows", "columns", "page_selected", "sort", "page", "n_pages"]) {
    model.on(`change:${name}`, schedule);
  }
}

export default { render };
