/* attn-explorer's page viewer: draws one run's attention from the page's data block (api/html.py).
 *
 * Views: the grid of every head, one head, token focus, lines between tokens, and the patch overlay
 * (image runs). Every view has a hover read-out (the token pair and its weight). No network, no
 * libraries: canvas and DOM only. The maps arrive as 8-bit levels against each row's largest weight
 * (row_scale, float32), deflated and base64-encoded; DecompressionStream unpacks them. The map views colour
 * each head from 0 to its largest weight; the overlay colours the query's patches from 0 to their 98th
 * percentile, with opacity alpha·sqrt(share), as the window's overlay does (gui/widgets/overlay.py).
 *
 * axBoot(root, data, onSelect) draws into root (a page's <div>, a notebook cell, an anywidget's el);
 * onSelect(layer, head, query) is called when the user picks a head or a query (the two-way widget).
 */
"use strict";

const AX_VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
const AX_VIEWS = [["grid", "All heads"], ["head", "One head"], ["tokens", "Token focus"],
  ["lines", "Lines"], ["overlay", "Overlay"]];
const AX_LINE_FLOOR = 0.05; // the lines view leaves out weights under this share of the head's largest
const AX_IDLE = "Hover a map or a token to read its weight.";
const AX_CLIP_PERCENTILE = 98; // the overlay's colour tops out at this percentile of the query's patch weights
const AX_LOG_DECADES = 4; // and on the log scale spans this many powers of ten below it (maths.LOG_DECADES)
const AX_QUERY_COLOUR = "#ff7f0e"; // the outlined query row, and its axis label

/* numpy.percentile (linear interpolation) of an array of numbers. */
function axPercentile(values, p) {
  const v = Float64Array.from(values).sort(), pos = p / 100 * (v.length - 1), k = Math.floor(pos);
  if (!v.length) return 0;
  return k + 1 < v.length ? v[k] + (pos - k) * (v[k + 1] - v[k]) : v[k];
}

/* 256 RGBA entries of viridis (the window's default colormap). */
function axLut() {
  const lut = new Uint8ClampedArray(256 * 4);
  for (let t = 0; t < 256; t++) {
    const x = t / 255 * (AX_VIRIDIS.length - 1), k = Math.min(Math.floor(x), AX_VIRIDIS.length - 2), f = x - k;
    for (let c = 0; c < 3; c++) lut[t * 4 + c] = Math.round(AX_VIRIDIS[k][c] * (1 - f) + AX_VIRIDIS[k + 1][c] * f);
    lut[t * 4 + 3] = 255;
  }
  return lut;
}

/* base64 of zlib-deflated bytes -> Uint8Array. */
async function axUnpack(b64) {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser cannot unpack the page's data: it needs DecompressionStream " +
      "(Chrome 80, Firefox 113, Safari 16.4 or newer)");
  }
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function axEl(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/* A canvas sized in CSS pixels, sharp on high-density screens; returns [canvas, ctx]. */
function axCanvas(w, h) {
  const c = axEl("canvas", "ax-canvas"), dpr = window.devicePixelRatio || 1;
  c.width = Math.max(1, Math.round(w * dpr));
  c.height = Math.max(1, Math.round(h * dpr));
  c.style.width = w + "px";
  c.style.height = h + "px";
  const ctx = c.getContext("2d");
  ctx.scale(dpr, dpr);
  return [c, ctx];
}

function axMouse(ev, canvas) {
  const b = canvas.getBoundingClientRect();
  return [ev.clientX - b.left, ev.clientY - b.top];
}

function axFmt(w) {
  return w.toFixed(3);
}

/* a colour bar's end: 0.008, or 8e-7 where three decimals would read 0.000 */
function axFmtEnd(w) {
  return w === 0 || w >= 0.001 ? w.toFixed(3) : w.toExponential(0);
}

class AxViewer {
  constructor(root, d, onSelect) {
    this.root = root;
    this.d = d;
    this.onSelect = onSelect || null;
    this.view = d.view;
    this.layer = d.layer;
    this.head = d.head;
    this.query = d.query;
    this.log = !!d.log_scale;
    this.alpha = 0.55; // the window's default overlay opacity
    this.lut = axLut();
    this.tiles = new Map(); // "l,h,log" -> an n x n canvas of that head
  }

  async load() {
    const m = this.d.maps;
    [this.L, this.H, this.n] = [m.shape[0], m.shape[1], m.shape[2]];
    this.levels = m.levels;
    this.q = await axUnpack(m.data);
    if (this.q.length !== this.L * this.H * this.n * this.n) throw new Error("the page's data is damaged");
    this.scale = [].concat(...m.scale);
    const rows = await axUnpack(m.row_scale.data);
    this.rowScale = new Float32Array(rows.buffer, rows.byteOffset, rows.byteLength / 4);
    if (this.rowScale.length !== this.L * this.H * this.n) throw new Error("the page's data is damaged");
    this.split = 0; // image runs: keys before the patches ([CLS], registers) have their own scale per row
    if (m.prefix_scale) {
      const pre = await axUnpack(m.prefix_scale.data);
      this.prefixScale = new Float32Array(pre.buffer, pre.byteOffset, pre.byteLength / 4);
      this.split = this.d.patch_offset;
    }
    this.isImage = !!this.d.grid;
    if (this.d.image) {
      this.rgb = await axUnpack(this.d.image.data);
      [this.imgH, this.imgW] = this.d.image.shape;
    }
  }

  // ---- numbers -------------------------------------------------------------------------------------
  lv(l, h, i, j) { return this.q[((l * this.H + h) * this.n + i) * this.n + j]; }
  w(l, h, i, j) {
    const s = j < this.split ? this.prefixScale : this.rowScale;
    return this.lv(l, h, i, j) * s[(l * this.H + h) * this.n + i] / this.levels;
  }
  /* a weight on the head's scale: 0..levels against the head's largest weight (the map views' colours) */
  hl(l, h, i, j) { return this.w(l, h, i, j) / this.scale[l * this.H + h] * this.levels; }
  /* colour index of a level: linear, or log (level 1 = one step of the head's largest weight, to the top) */
  ci(level) {
    if (!this.log) return Math.round(level);
    return level < 1 ? 0 : Math.round(255 * Math.log(level) / Math.log(this.levels));
  }
  tok(i) {
    const t = this.d.labels[i];
    return this.d.edges ? t : `“${t}” (${this.d.token_index[i]})`;
  }
  /* the largest weight of query i's row */
  rowMax(l, h, i) {
    let m = 0;
    for (let j = 0; j < this.n; j++) m = Math.max(m, this.w(l, h, i, j));
    return m;
  }
  /* an n x n canvas of one head's levels in colour (cached) */
  tile(l, h) {
    const key = `${l},${h},${this.log}`;
    if (this.tiles.has(key)) return this.tiles.get(key);
    const n = this.n, c = document.createElement("canvas");
    c.width = n;
    c.height = n;
    const ctx = c.getContext("2d"), img = ctx.createImageData(n, n), base = (l * this.H + h) * n * n;
    for (let k = 0; k < n * n; k++) {
      const t = this.ci(this.hl(l, h, Math.floor(k / n), k % n)) * 4;
      img.data[k * 4] = this.lut[t];
      img.data[k * 4 + 1] = this.lut[t + 1];
      img.data[k * 4 + 2] = this.lut[t + 2];
      img.data[k * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    this.tiles.set(key, c);
    return c;
  }
  colour(level, alpha) {
    const t = this.ci(level) * 4;
    return `rgba(${this.lut[t]},${this.lut[t + 1]},${this.lut[t + 2]},${alpha === undefined ? 1 : alpha})`;
  }

  // ---- frame ---------------------------------------------------------------------------------------
  build() {
    const d = this.d, r = this.root;
    r.textContent = "";
    r.classList.add("ax-root");
    r.appendChild(axEl("h1", "ax-title", d.title));
    const notes = axEl("ul", "ax-notes");
    for (const t of d.notes) notes.appendChild(axEl("li", "", t));
    r.appendChild(notes);
    const bar = axEl("div", "ax-bar");
    this.tabs = {};
    for (const [name, title] of AX_VIEWS) {
      if (name === "overlay" && !this.isImage) continue;
      const b = axEl("button", "ax-tab", title);
      b.type = "button";
      b.dataset.view = name;
      b.addEventListener("click", () => this.setView(name));
      this.tabs[name] = b;
      bar.appendChild(b);
    }
    r.appendChild(bar);
    const ctl = axEl("div", "ax-controls");
    this.layerSel = this.select(ctl, "Layer", this.L, (k) => `L${k}`, (v) => this.pick(v, this.head));
    this.headSel = this.select(ctl, "Head", this.H, (k) => `H${k}`, (v) => this.pick(this.layer, v));
    this.querySel = this.select(ctl, "Query", this.n, (k) => this.tok(k), (v) => this.setQuery(v));
    const logLab = axEl("label", "ax-control");
    this.logBox = axEl("input");
    this.logBox.type = "checkbox";
    this.logBox.checked = this.log;
    this.logBox.addEventListener("change", () => { this.log = this.logBox.checked; this.render(); });
    logLab.append(this.logBox, " log colour");
    ctl.appendChild(logLab);
    this.alphaLab = axEl("label", "ax-control", "Opacity ");
    const a = axEl("input");
    a.type = "range";
    a.min = "0"; a.max = "1"; a.step = "0.05"; a.value = String(this.alpha);
    a.addEventListener("input", () => { this.alpha = Number(a.value); this.render(); });
    this.alphaLab.appendChild(a);
    ctl.appendChild(this.alphaLab);
    r.appendChild(ctl);
    this.readout = axEl("div", "ax-readout", AX_IDLE);
    this.readout.setAttribute("aria-live", "polite");
    r.appendChild(this.readout);
    this.legend = axEl("div", "ax-legend");
    r.appendChild(this.legend);
    this.stage = axEl("div", "ax-stage");
    r.appendChild(this.stage);
    if (typeof ResizeObserver !== "undefined") {
      let width = 0;
      new ResizeObserver(() => {
        const w = this.stage.clientWidth;
        if (Math.abs(w - width) > 8) { width = w; this.render(); }
      }).observe(this.stage);
    }
  }

  select(parent, label, count, text, changed) {
    const lab = axEl("label", "ax-control", label + " "), s = axEl("select");
    for (let k = 0; k < count; k++) {
      const o = axEl("option", "", text(k));
      o.value = String(k);
      s.appendChild(o);
    }
    s.addEventListener("change", () => changed(Number(s.value)));
    lab.appendChild(s);
    parent.appendChild(lab);
    return s;
  }

  say(text) { this.readout.textContent = text; }

  // ---- state ---------------------------------------------------------------------------------------
  setView(v) { this.view = v; this.render(); }
  pick(layer, head) {
    this.layer = layer;
    this.head = head;
    this.render();
    if (this.onSelect) this.onSelect(layer, head, this.query);
  }
  setQuery(i) {
    this.query = i;
    this.render();
    if (this.onSelect) this.onSelect(this.layer, this.head, i);
  }
  /* from outside (the widget's Python side): show this selection, tell nobody */
  setSelection(layer, head, query) {
    this.layer = layer;
    this.head = head;
    if (query !== undefined && query !== null) this.query = query;
    this.render();
  }

  render() {
    if (!this.stage) this.build();
    for (const [name, b] of Object.entries(this.tabs)) b.classList.toggle("ax-active", name === this.view);
    this.layerSel.value = String(this.layer);
    this.headSel.value = String(this.head);
    this.querySel.value = String(this.query);
    this.querySel.parentElement.style.display = this.view === "grid" ? "none" : "";
    this.alphaLab.style.display = this.view === "overlay" ? "" : "none";
    this.stage.textContent = "";
    this.say(AX_IDLE);
    const draw = {grid: this.drawGrid, head: this.drawHead, tokens: this.drawTokens, lines: this.drawLines,
      overlay: this.drawOverlay}[this.view];
    draw.call(this);
    this.root.dataset.axView = this.view;
    this.root.dataset.axReady = "1";
    this.tellHeight();
  }

  /* A whole page inside a notebook's iframe: tell the notebook how tall it is now (api/notebook.py). */
  tellHeight() {
    if (this.root.dataset.axPage && window.parent !== window) {
      window.parent.postMessage({axPageHeight: document.documentElement.scrollHeight}, "*");
    }
  }

  width() { return Math.max(320, (this.stage.clientWidth || this.root.clientWidth || 960) - 4); }

  // ---- the grid of every head ----------------------------------------------------------------------
  drawGrid() {
    const L = this.L, H = this.H, n = this.n, left = 34, top = 18, gap = 4;
    const cell = Math.max(16, Math.min(160, Math.floor((this.width() - left) / H) - gap));
    const W = left + H * (cell + gap), Ht = top + L * (cell + gap);
    const [c, ctx] = axCanvas(W, Ht);
    c.classList.add("ax-map"); // the view's own drawing (not its colour bar)
    const paint = () => { // in place: a click re-selects without replacing the canvas (so a double-click lands)
      ctx.clearRect(0, 0, W, Ht);
      ctx.imageSmoothingEnabled = n > cell; // shrinking: average; enlarging: one block a cell
      ctx.font = "11px sans-serif";
      ctx.fillStyle = "#333";
      ctx.textAlign = "center";
      for (let h = 0; h < H; h++) ctx.fillText(`H${h}`, left + h * (cell + gap) + cell / 2, 12);
      ctx.textAlign = "right";
      for (let l = 0; l < L; l++) ctx.fillText(`L${l}`, left - 6, top + l * (cell + gap) + cell / 2 + 4);
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) ctx.drawImage(this.tile(l, h), left + h * (cell + gap), top + l * (cell + gap), cell, cell);
      }
      ctx.strokeStyle = "#ff7f0e";
      ctx.lineWidth = 2;
      ctx.strokeRect(left + this.head * (cell + gap) - 1, top + this.layer * (cell + gap) - 1, cell + 2, cell + 2);
    };
    paint();
    this.legend.textContent = "Every head: layers down, heads across. Row = the query token (where it looks), " +
      "column = the key. Each map coloured from 0 to its own largest weight" + (this.log ? " (log)" : "") +
      ". Click a head to select it; double-click to open it.";
    const at = (ev) => {
      const [x, y] = axMouse(ev, c);
      const h = Math.floor((x - left) / (cell + gap)), l = Math.floor((y - top) / (cell + gap));
      const cx = x - left - h * (cell + gap), cy = y - top - l * (cell + gap);
      if (h < 0 || l < 0 || h >= H || l >= L || cx >= cell || cy >= cell || cx < 0 || cy < 0) return null;
      return [l, h, Math.min(n - 1, Math.floor(cy / cell * n)), Math.min(n - 1, Math.floor(cx / cell * n))];
    };
    c.addEventListener("mousemove", (ev) => {
      const p = at(ev);
      if (!p) { this.say(AX_IDLE); return; }
      const [l, h, i, j] = p;
      this.say(`L${l} H${h} · query ${this.tok(i)} → key ${this.tok(j)}: ${axFmt(this.w(l, h, i, j))}`);
    });
    c.addEventListener("mouseleave", () => this.say(AX_IDLE));
    c.addEventListener("click", (ev) => {
      const p = at(ev);
      if (!p) return;
      [this.layer, this.head] = [p[0], p[1]];
      this.layerSel.value = String(this.layer);
      this.headSel.value = String(this.head);
      paint();
      if (this.onSelect) this.onSelect(this.layer, this.head, this.query);
    });
    c.addEventListener("dblclick", (ev) => { if (at(ev)) this.setView("head"); });
    this.stage.appendChild(c);
  }

  // ---- one head ------------------------------------------------------------------------------------
  drawHead() {
    const n = this.n, l = this.layer, h = this.head, labels = n <= 96;
    const probe = axCanvas(1, 1)[1];
    probe.font = "11px sans-serif";
    let lw = 0;
    if (labels) for (let i = 0; i < n; i++) lw = Math.max(lw, probe.measureText(this.d.labels[i]).width);
    const left = labels ? Math.min(140, lw) + 10 : 40, top = labels ? Math.min(110, lw * 0.75) + 14 : 20;
    const room = window.innerHeight - this.stage.getBoundingClientRect().top - top - 50; // the colour bar above
    const side = Math.max(240, Math.min(680, this.width() - left - 10, room > 0 ? room : 680));
    const cell = side / n;
    const [c, ctx] = axCanvas(left + side + 4, top + side + 4);
    c.classList.add("ax-map"); // the view's own drawing (not its colour bar)
    ctx.imageSmoothingEnabled = n > side;
    ctx.drawImage(this.tile(l, h), left, top, side, side);
    ctx.font = "11px sans-serif";
    ctx.fillStyle = "#333";
    if (labels && cell >= 6) {
      const every = Math.ceil(11 / cell);
      ctx.textAlign = "right";
      for (let i = 0; i < n; i += every) ctx.fillText(this.d.labels[i], left - 4, top + (i + 0.5) * cell + 4, left - 6);
      for (let j = 0; j < n; j += every) {
        ctx.save();
        ctx.translate(left + (j + 0.5) * cell + 4, top - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.textAlign = "left";
        ctx.fillText(this.d.labels[j], 0, 0, 1.3 * top);
        ctx.restore();
      }
    } else {
      // no room for the tokens: ticks at about 8 rows (and columns), each labelled with its cell's first token
      // position (token_index; cell i of a pooled page covers tokens [edges[i], edges[i + 1])), and the query row
      const pos = (i) => String(this.d.token_index[i]), step = Math.ceil(n / 8), qy = top + (this.query + 0.5) * cell;
      ctx.textAlign = "right";
      for (let i = 0; i < n; i += step) {
        if (Math.abs(top + (i + 0.5) * cell - qy) >= 11) ctx.fillText(pos(i), left - 4, top + (i + 0.5) * cell + 4);
      }
      ctx.fillStyle = AX_QUERY_COLOUR;
      ctx.fillText(pos(this.query), left - 4, qy + 4);
      ctx.fillStyle = "#333";
      ctx.textAlign = "center";
      for (let j = step; j < n; j += step) ctx.fillText(pos(j), left + (j + 0.5) * cell, top - 5);
    }
    ctx.strokeStyle = AX_QUERY_COLOUR;
    ctx.lineWidth = 1.5;
    ctx.strokeRect(left, top + this.query * cell, side, Math.max(cell, 1.5));
    const top1 = this.scale[l * this.H + h];
    this.legend.textContent = `Layer ${l}, head ${h}. Row = the query token, column = the key. Colour from ` +
      (this.log ? `${axFmt(top1 / this.levels)} to ${axFmt(top1)} (log)` : `0 to ${axFmt(top1)}`) +
      ", this head's largest weight. The outlined row is the query; click a row to choose it.";
    const at = (ev) => {
      const [x, y] = axMouse(ev, c);
      const i = Math.floor((y - top) / cell), j = Math.floor((x - left) / cell);
      return i >= 0 && j >= 0 && i < n && j < n ? [i, j] : null;
    };
    c.addEventListener("mousemove", (ev) => {
      const p = at(ev);
      if (!p) { this.say(AX_IDLE); return; }
      this.say(`L${l} H${h} · query ${this.tok(p[0])} → key ${this.tok(p[1])}: ${axFmt(this.w(l, h, p[0], p[1]))}`);
    });
    c.addEventListener("mouseleave", () => this.say(AX_IDLE));
    c.addEventListener("click", (ev) => { const p = at(ev); if (p) this.setQuery(p[0]); });
    this.stage.appendChild(this.colourBar(this.log ? top1 / this.levels : 0, top1,
      "weight" + (this.log ? " (log)" : "") + ", 0 to this head's largest"));
    this.stage.appendChild(c);
  }

  /* a colour bar from lo to hi (their labels under its ends), titled */
  colourBar(lo, hi, title) {
    const [c, ctx] = axCanvas(420, 30);
    c.classList.add("ax-colourbar");
    for (let x = 0; x < 200; x++) {
      const t = Math.round(x / 199 * 255) * 4;
      ctx.fillStyle = `rgb(${this.lut[t]},${this.lut[t + 1]},${this.lut[t + 2]})`;
      ctx.fillRect(30 + x, 2, 1, 12);
    }
    ctx.font = "10px sans-serif";
    ctx.fillStyle = "#333";
    ctx.textAlign = "center";
    ctx.fillText(lo === 0 ? "0" : axFmtEnd(lo), 30, 26);
    ctx.fillText(axFmtEnd(hi), 230, 26);
    ctx.textAlign = "left";
    ctx.fillText(title, 262, 12);
    c.title = title;
    return c;
  }

  // ---- token focus ---------------------------------------------------------------------------------
  drawTokens() {
    const l = this.layer, h = this.head, i = this.query, n = this.n, top = this.rowMax(l, h, i) || 1;
    const box = axEl("div", "ax-tokens");
    for (let j = 0; j < n; j++) {
      const s = axEl("span", "ax-token", this.d.labels[j]);
      const rel = Math.round(this.w(l, h, i, j) / top * 255);
      s.style.background = this.colour(rel, 0.15 + 0.85 * rel / 255);
      s.style.color = rel > 150 ? "#111" : (rel > 40 ? "#fff" : "#222");
      if (j === i) s.classList.add("ax-query");
      if (this.d.special[j]) s.classList.add("ax-special");
      s.addEventListener("mouseenter", () =>
        this.say(`L${l} H${h} · query ${this.tok(i)} → key ${this.tok(j)}: ${axFmt(this.w(l, h, i, j))}`));
      s.addEventListener("mouseleave", () => this.say(AX_IDLE));
      s.addEventListener("click", () => this.setQuery(j));
      box.appendChild(s);
    }
    this.stage.appendChild(box);
    const order = [...Array(n).keys()].sort((a, b) => this.w(l, h, i, b) - this.w(l, h, i, a)).slice(0, 5);
    const topList = axEl("p", "ax-top", `Strongest keys of ${this.tok(i)}: ` +
      order.map((j) => `${this.tok(j)} ${axFmt(this.w(l, h, i, j))}`).join(", "));
    this.stage.appendChild(topList);
    this.legend.textContent = `Layer ${l}, head ${h}: where the outlined query token looks. Shade = its weight on ` +
      `each token, relative to this row's largest (${axFmt(top)}). ` +
      "Click a token to make it the query.";
  }

  // ---- lines between tokens (as in bertviz) --------------------------------------------------------
  drawLines() {
    const l = this.layer, h = this.head, n = this.n, rh = n > 64 ? 14 : 20, font = n > 64 ? 10 : 12;
    const probe = axCanvas(1, 1)[1];
    probe.font = `${font}px sans-serif`;
    let lw = 0;
    for (let i = 0; i < n; i++) lw = Math.max(lw, probe.measureText(this.d.labels[i]).width);
    const colW = Math.min(180, lw + 12), gap = Math.max(160, Math.min(320, this.width() - 2 * colW - 20));
    const W = 2 * colW + gap, Ht = n * rh + 10, x0 = colW, x1 = colW + gap;
    const [c, ctx] = axCanvas(W, Ht);
    c.classList.add("ax-map"); // the view's own drawing (not its colour bar)
    const y = (i) => 5 + (i + 0.5) * rh;
    let shown; // the hover state drawn: repaint (every line) only when it changes
    const paint = (hover) => { // hover: null, ["q", i] or ["k", j]
      const key = hover ? hover.join() : "";
      if (key === shown) return;
      shown = key;
      ctx.clearRect(0, 0, W, Ht);
      // one stroke a line, its opacity in globalAlpha; 1 px lines draw several times faster than wider ones
      // (65,536 pairs at 256 tokens), and the few lines of one hovered token get 2 px
      ctx.lineWidth = hover ? 2 : 1;
      ctx.strokeStyle = "rgb(31,119,180)";
      for (let i = 0; i < n; i++) {
        if (hover && hover[0] === "q" && hover[1] !== i) continue;
        for (let j = 0; j < n; j++) {
          const rel = this.hl(l, h, i, j) / this.levels;
          if (rel < AX_LINE_FLOOR || (hover && hover[0] === "k" && hover[1] !== j)) continue;
          ctx.globalAlpha = rel;
          ctx.beginPath();
          ctx.moveTo(x0 + 2, y(i));
          ctx.lineTo(x1 - 2, y(j));
          ctx.stroke();
        }
      }
      ctx.globalAlpha = 1;
      ctx.font = `${font}px sans-serif`;
      for (let i = 0; i < n; i++) {
        const lit = hover && hover[0] === "q" && hover[1] === i, litK = hover && hover[0] === "k" && hover[1] === i;
        ctx.fillStyle = lit || i === this.query ? "#d35400" : (this.d.special[i] ? "#888" : "#222");
        ctx.textAlign = "right";
        ctx.fillText(this.d.labels[i], x0 - 6, y(i) + font / 3, colW - 8);
        ctx.fillStyle = litK ? "#d35400" : (this.d.special[i] ? "#888" : "#222");
        ctx.textAlign = "left";
        ctx.fillText(this.d.labels[i], x1 + 6, y(i) + font / 3, colW - 8);
      }
    };
    paint(null);
    const strongest = (side, k) => {
      let best = 0, arg = 0;
      for (let m = 0; m < n; m++) {
        const v = side === "q" ? this.w(l, h, k, m) : this.w(l, h, m, k);
        if (v > best) { best = v; arg = m; }
      }
      return arg;
    };
    c.addEventListener("mousemove", (ev) => {
      const [x, yy] = axMouse(ev, c), k = Math.floor((yy - 5) / rh);
      if (k < 0 || k >= n || (x > x0 && x < x1)) { paint(null); this.say(AX_IDLE); return; }
      if (x <= x0) {
        const j = strongest("q", k);
        paint(["q", k]);
        this.say(`L${l} H${h} · query ${this.tok(k)} → key ${this.tok(j)}: ${axFmt(this.w(l, h, k, j))} (its strongest)`);
      } else {
        const i = strongest("k", k);
        paint(["k", k]);
        this.say(`L${l} H${h} · query ${this.tok(i)} → key ${this.tok(k)}: ${axFmt(this.w(l, h, i, k))} (the key's strongest query)`);
      }
    });
    c.addEventListener("mouseleave", () => { paint(null); this.say(AX_IDLE); });
    c.addEventListener("click", (ev) => {
      const [x, yy] = axMouse(ev, c), k = Math.floor((yy - 5) / rh);
      if (k >= 0 && k < n && x <= x0) this.setQuery(k);
    });
    this.stage.appendChild(c);
    this.legend.textContent = `Layer ${l}, head ${h}: a line from each query token (left) to each key (right), ` +
      `its opacity the weight over this head's largest (${axFmt(this.scale[l * this.H + h])}); under ` +
      `${AX_LINE_FLOOR * 100} % of it not drawn. Hover a token to see only its lines.`;
  }

  // ---- the patch overlay (image runs) --------------------------------------------------------------
  drawOverlay() {
    const [gr, gc] = this.d.grid, off = this.d.patch_offset, l = this.layer, h = this.head, i = this.query;
    const iw = this.imgW || gc * 16, ih = this.imgH || gr * 16;
    const k = Math.min(520, this.width() - 10) / Math.max(iw, ih), W = Math.round(iw * k), Ht = Math.round(ih * k);
    const [c, ctx] = axCanvas(W, Ht);
    c.classList.add("ax-map"); // the view's own drawing (not its colour bar)
    if (this.rgb) {
      const pic = document.createElement("canvas");
      pic.width = iw;
      pic.height = ih;
      const pctx = pic.getContext("2d"), img = pctx.createImageData(iw, ih);
      for (let p = 0; p < iw * ih; p++) {
        img.data[p * 4] = this.rgb[p * 3];
        img.data[p * 4 + 1] = this.rgb[p * 3 + 1];
        img.data[p * 4 + 2] = this.rgb[p * 3 + 2];
        img.data[p * 4 + 3] = 255;
      }
      pctx.putImageData(img, 0, 0);
      ctx.drawImage(pic, 0, 0, W, Ht);
    }
    // the window's scale (maths.clipped_values): 0 to the 98th percentile of the query's patch weights, or
    // on the log scale the 4 powers of ten below it; stronger patches saturate
    const weights = [];
    for (let p = 0; p < gr * gc; p++) weights.push(this.w(l, h, i, off + p));
    let top = axPercentile(weights, AX_CLIP_PERCENTILE);
    if (!(top > 0)) top = Math.max(...weights) > 0 ? Math.max(...weights) : 1e-6;
    const hi = this.log ? Math.log10(top) : top, lo = this.log ? hi - AX_LOG_DECADES : 0;
    const share = (v) => {
      const x = this.log ? Math.log10(Math.max(v, 10 ** lo)) : v;
      return hi > lo ? Math.min(1, Math.max(0, (x - lo) / (hi - lo))) : 0;
    };
    const heat = document.createElement("canvas");
    heat.width = gc;
    heat.height = gr;
    const hctx = heat.getContext("2d"), hm = hctx.createImageData(gc, gr);
    for (let p = 0; p < gr * gc; p++) {
      const s = share(weights[p]), t = Math.floor(s * 255) * 4;
      hm.data[p * 4] = this.lut[t];
      hm.data[p * 4 + 1] = this.lut[t + 1];
      hm.data[p * 4 + 2] = this.lut[t + 2];
      // opacity grows with the weight, so the photo shows through where the head does not look
      hm.data[p * 4 + 3] = Math.round(255 * (this.rgb ? this.alpha * Math.sqrt(s) : 1));
    }
    hctx.putImageData(hm, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(heat, 0, 0, W, Ht);
    const pw = W / gc, ph = Ht / gr;
    if (i >= off && i < off + gr * gc) {
      ctx.strokeStyle = "#ff3b30";
      ctx.lineWidth = 2;
      ctx.strokeRect(((i - off) % gc) * pw, Math.floor((i - off) / gc) * ph, pw, ph);
    }
    const at = (ev) => {
      const [x, y] = axMouse(ev, c), col = Math.floor(x / pw), row = Math.floor(y / ph);
      return col >= 0 && row >= 0 && col < gc && row < gr ? off + row * gc + col : null;
    };
    c.addEventListener("mousemove", (ev) => {
      const j = at(ev);
      if (j === null) { this.say(AX_IDLE); return; }
      this.say(`L${l} H${h} · query ${this.tok(i)} → patch ${this.tok(j)}: ${axFmt(this.w(l, h, i, j))}`);
    });
    c.addEventListener("mouseleave", () => this.say(AX_IDLE));
    c.addEventListener("click", (ev) => { const j = at(ev); if (j !== null) this.setQuery(j); });
    const title = this.log ? `log₁₀ weight (top: ${AX_CLIP_PERCENTILE}th pct)` : `weight (0 to ${AX_CLIP_PERCENTILE}th pct)`;
    this.stage.appendChild(this.colourBar(this.log ? 10 ** lo : 0, top, title));
    this.stage.appendChild(c);
    this.legend.textContent = `Layer ${l}, head ${h}: how much the query ${this.tok(i)} attends to each patch. ` +
      `Colour and opacity from 0 to the ${AX_CLIP_PERCENTILE}th percentile of its patch weights (${axFmt(top)}; ` +
      `the top ${100 - AX_CLIP_PERCENTILE} % saturate)${this.log ? `, log over ${AX_LOG_DECADES} powers of ten` : ""}. ` +
      "Click a patch to make it the query.";
  }
}

/* Draw data into root; returns the viewer (or null, with the reason on the page, when it cannot). */
async function axBoot(root, data, onSelect) {
  try {
    const v = new AxViewer(root, data, onSelect);
    await v.load();
    v.render();
    return v;
  } catch (e) {
    root.textContent = "";
    root.appendChild(axEl("p", "ax-error", "Cannot show this page: " + (e && e.message ? e.message : e)));
    root.dataset.axReady = "error";
    return null;
  }
}
