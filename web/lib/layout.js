// Geometry of the node's charts (pure: rectangles in node-local pixels, no canvas access).

/**
 * Vertical bars for values in [0, maxValue], left to right inside rect, bottoms on the rect's bottom edge.
 *
 * @param {number[]} values
 * @param {{x: number, y: number, w: number, h: number}} rect
 * @param {{gap?: number, maxValue?: number}} [opts]
 * @returns {{x: number, y: number, w: number, h: number}[]}
 */
export function columnBars(values, rect, opts = {}) {
  const n = values.length;
  if (!n || rect.w <= 0 || rect.h <= 0) return [];
  const gap = Math.max(0, opts.gap ?? 2);
  const maxValue = opts.maxValue > 0 ? opts.maxValue : Math.max(1e-9, ...values);
  const w = Math.max(1, (rect.w - gap * (n - 1)) / n);
  return values.map((v, i) => {
    const frac = Math.max(0, Math.min(1, (Number.isFinite(v) ? v : 0) / maxValue));
    const h = frac * rect.h;
    return { x: rect.x + i * (w + gap), y: rect.y + rect.h - h, w, h };
  });
}

/**
 * Horizontal bars, one row per fraction in [0, 1], stacked from the top of rect.
 * Each row gives the full track and the filled part.
 */
export function rowBars(fractions, rect, opts = {}) {
  const n = fractions.length;
  if (!n || rect.w <= 0 || rect.h <= 0) return [];
  const gap = Math.max(0, opts.gap ?? 3);
  const rowH = Math.max(1, Math.min(opts.maxRowH ?? 14, (rect.h - gap * (n - 1)) / n));
  return fractions.map((f, i) => {
    const y = rect.y + i * (rowH + gap);
    const frac = Math.max(0, Math.min(1, Number.isFinite(f) ? f : 0));
    return { track: { x: rect.x, y, w: rect.w, h: rowH }, fill: { x: rect.x, y, w: frac * rect.w, h: rowH } };
  });
}

/** The band of sampling steps a schedule is active in, as an x-range of rect. */
export function windowSpan(startPercent, endPercent, rect) {
  const s = Math.max(0, Math.min(1, Number.isFinite(startPercent) ? startPercent : 0));
  const e = Math.max(s, Math.min(1, Number.isFinite(endPercent) ? endPercent : 1));
  return { x: rect.x + s * rect.w, y: rect.y, w: (e - s) * rect.w, h: rect.h };
}

/** Stable colour per U-Net level (factor 8, 16, 32, 64), DiT's one level (0); others grey. */
export function levelColor(level) {
  return { 0: "#a98be0", 8: "#4fa3e0", 16: "#59c27a", 32: "#e0b44f", 64: "#d9675b" }[level] ?? "#999999";
}

/**
 * The size a node needs so that a preview of at least `previewH` px fits below its widgets, or null when `size`
 * already has that room (never smaller than it is: a node the user made bigger stays so).
 * @param {number[]|undefined} size the node's [w, h]
 * @param {number[]|undefined} min its computeSize() (widgets and panels, the preview widget when there is one)
 * @param {number} previewH room for the preview below `min` (0 when `min` already counts it)
 * @param {number} minW smallest width
 * @returns {number[]|null}
 */
export function previewRoom(size, min, previewH, minW) {
  const w = size?.[0] ?? 0;
  const h = size?.[1] ?? 0;
  const wantW = Math.max(w, minW, min?.[0] ?? 0);
  const wantH = Math.max(h, (min?.[1] ?? 0) + previewH);
  return wantW > w || wantH > h ? [wantW, wantH] : null;
}
