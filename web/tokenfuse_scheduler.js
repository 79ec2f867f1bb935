// TokenSchedulerController in the browser: a chart of the per-block ratio pyramid that follows the widgets, and
// live token counts / step time / peak memory while sampling, then the run's summary.
//
// Live stats arrive as `tokenfuse.stats` websocket events; their payload is documented in ./lib/stats.js and
// ./README.md. Every access to node state is guarded: widgets may be missing, renamed or converted to inputs.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { chartFamily, MAX_RATIO, pyramidSeries, resolveSchedule } from "./lib/pyramid.js";
import { keptFraction, levelLabel, matchEventToNodes, mergeStats, normalizeStats, statsLines } from "./lib/stats.js";
import { columnBars, levelColor, rowBars, windowSpan } from "./lib/layout.js";

const NODE_TYPE = "TokenFuseTokenSchedulerController";
const PANEL_H = 196; // chart (92 px) + stats (~96 px) + padding
const CHART_WIDGET = "tokenfuse_chart";
const WATCHED = ["preset", "strategy", "ratio", "schedule_text"]; // nodes/scheduler_node.py widgets
const TEXT = "#b8b8b8";
const DIM = "#6c6c6c";
const TRACK = "rgba(255,255,255,0.08)";

const liveStats = new WeakMap(); // node -> normalized stats of its latest event
let warned = false;

function warnOnce(err) {
  if (!warned) {
    warned = true;
    console.warn("[tokenfuse] chart drawing skipped:", err);
  }
}

function widgetValues(node) {
  const out = {};
  for (const w of node?.widgets ?? []) {
    if (w && typeof w.name === "string") out[w.name] = w.value;
  }
  return out;
}

function graphNodes(graph) {
  const nodes = graph?.nodes ?? graph?._nodes;
  return Array.isArray(nodes) ? nodes : [];
}

function isController(node) {
  return node?.comfyClass === NODE_TYPE || node?.type === NODE_TYPE;
}

/** Every TokenSchedulerController of the open workflow, root graph first, then nodes inside subgraphs. */
function controllers() {
  const out = [];
  const root = app?.graph;
  for (const n of graphNodes(root)) if (isController(n)) out.push({ node: n, inRoot: true });
  const subgraphs = root?.subgraphs;
  if (subgraphs && typeof subgraphs.values === "function") {
    for (const sg of subgraphs.values()) {
      for (const n of graphNodes(sg)) if (isController(n)) out.push({ node: n, inRoot: false });
    }
  }
  return out;
}

function text(ctx, s, x, y, color = TEXT, align = "left") {
  ctx.fillStyle = color;
  ctx.textAlign = align;
  ctx.fillText(s, x, y);
}

function drawPyramid(ctx, rect, values, stats) {
  const family = chartFamily(values.family ?? values.model_family, stats?.levels);
  const schedule = resolveSchedule(values, family);
  const series = pyramidSeries(schedule, family);
  const ratio = Number(values.ratio);
  const detail = ratio > 0 && schedule.preset !== "off" ? `ratio ${ratio.toFixed(2)}` : "preset ratios";
  const anyOn = series.some((b) => b.ratio > 0);
  const head = anyOn ? `${schedule.preset} · ${schedule.strategy} · ${detail}` : "off (identity)";
  text(ctx, `tokens out of attention per block (${family}): ${head}`, rect.x, rect.y + 10);
  const chart = { x: rect.x, y: rect.y + 16, w: rect.w, h: rect.h - 34 };
  ctx.fillStyle = TRACK;
  ctx.fillRect(chart.x, chart.y, chart.w, chart.h);
  const bars = columnBars(
    series.map((b) => b.ratio),
    chart,
    { gap: 2, maxValue: MAX_RATIO },
  );
  bars.forEach((b, i) => {
    ctx.fillStyle = levelColor(series[i].level);
    ctx.fillRect(b.x, b.y, b.w, Math.max(b.h, series[i].ratio > 0 ? 1 : 0));
  });
  // 50 % guide line, dashed.
  const guideY = chart.y + chart.h - (0.5 / MAX_RATIO) * chart.h;
  ctx.save();
  ctx.strokeStyle = DIM;
  ctx.setLineDash([3, 3]);
  ctx.beginPath();
  ctx.moveTo(chart.x, guideY);
  ctx.lineTo(chart.x + chart.w, guideY);
  ctx.stroke();
  ctx.restore();
  text(ctx, "50%", chart.x + chart.w - 2, guideY - 2, DIM, "right");
  // Sampling window in which the schedule is active.
  const strip = { x: rect.x, y: chart.y + chart.h + 5, w: rect.w, h: 4 };
  ctx.fillStyle = TRACK;
  ctx.fillRect(strip.x, strip.y, strip.w, strip.h);
  const span = windowSpan(schedule.startPercent, schedule.endPercent, strip);
  ctx.fillStyle = "#8a8ad8";
  ctx.fillRect(span.x, span.y, span.w, span.h);
  const pct = (x) => `${Math.round(x * 100)}%`;
  const note = schedule.textError ?? `active ${pct(schedule.startPercent)}–${pct(schedule.endPercent)} of steps`;
  text(ctx, note, rect.x, strip.y + 14, schedule.textError ? "#d08a7a" : DIM);
  let x = rect.x + rect.w;
  for (const lv of [64, 32, 16, 8]) {
    text(ctx, `/${lv}`, x, strip.y + 14, levelColor(lv), "right");
    x -= 24;
  }
}

function drawStats(ctx, rect, stats) {
  if (!stats) {
    text(ctx, "live token counts appear here while sampling", rect.x, rect.y + 12, DIM);
    return;
  }
  const lines = statsLines(stats);
  lines.forEach((ln, i) => text(ctx, ln, rect.x, rect.y + 12 + i * 13, stats.final && i === 1 ? "#d0d0a0" : TEXT));
  const top = rect.y + 8 + lines.length * 13;
  const rows = rowBars(
    stats.levels.map(keptFraction),
    { x: rect.x, y: top, w: rect.w, h: rect.y + rect.h - top },
    { gap: 3, maxRowH: 14 },
  );
  rows.forEach((r, i) => {
    const level = stats.levels[i];
    ctx.fillStyle = TRACK;
    ctx.fillRect(r.track.x, r.track.y, r.track.w, r.track.h);
    ctx.fillStyle = levelColor(level.level);
    ctx.globalAlpha = 0.55;
    ctx.fillRect(r.fill.x, r.fill.y, r.fill.w, r.fill.h);
    ctx.globalAlpha = 1;
    text(ctx, levelLabel(level), r.track.x + 4, r.track.y + r.track.h - 3, "#e8e8e8");
  });
}

function drawPanel(node, ctx, rect) {
  if (node?.flags?.collapsed || !(rect.w > 40) || !(rect.h > 40)) return;
  ctx.save();
  ctx.beginPath();
  ctx.rect(rect.x, rect.y, rect.w, rect.h);
  ctx.clip();
  ctx.font = "10px sans-serif";
  try {
    const chart = { x: rect.x, y: rect.y, w: rect.w, h: 92 };
    const stats = liveStats.get(node) ?? null;
    drawPyramid(ctx, chart, widgetValues(node), stats);
    const statsRect = { x: rect.x, y: rect.y + 98, w: rect.w, h: rect.h - 98 };
    drawStats(ctx, statsRect, stats);
  } catch (err) {
    warnOnce(err);
  } finally {
    ctx.restore();
  }
}

/**
 * A canvas-drawn widget below the node's own widgets: the frontend lays it out at a fixed height (computeSize)
 * and lets the multiline schedule_text take the remaining space. Not serialized (no workflow or prompt value).
 */
function chartWidget() {
  return {
    name: CHART_WIDGET,
    type: CHART_WIDGET,
    value: null,
    serialize: false,
    options: { serialize: false },
    computeSize(width) {
      return [Number.isFinite(width) ? width : 280, PANEL_H];
    },
    draw(ctx, node, width, y) {
      drawPanel(node, ctx, { x: 10, y: y + 2, w: (Number.isFinite(width) ? width : node.size?.[0] ?? 0) - 20, h: PANEL_H - 6 });
    },
    mouse() {
      return false;
    },
  };
}

function redraw(node) {
  node?.setDirtyCanvas?.(true, true);
}

function watchWidgets(node) {
  for (const w of node?.widgets ?? []) {
    if (!w || !WATCHED.includes(w.name) || w.__tokenfuseWatched) continue;
    const callback = w.callback;
    w.callback = function (...args) {
      const r = typeof callback === "function" ? callback.apply(this, args) : undefined;
      redraw(node);
      return r;
    };
    w.__tokenfuseWatched = true;
  }
}

function onStats(event) {
  const stats = normalizeStats(event?.detail);
  if (!stats) return;
  const found = controllers();
  const hits = matchEventToNodes(
    stats.node,
    found.map((c) => ({ id: c.node.id, inRoot: c.inRoot })),
  );
  for (const i of hits) {
    liveStats.set(found[i].node, mergeStats(liveStats.get(found[i].node), stats));
    redraw(found[i].node);
  }
}

function onExecutionStart() {
  for (const { node } of controllers()) {
    if (liveStats.delete(node)) redraw(node);
  }
}

app.registerExtension({
  name: "tokenfuse.scheduler",

  setup() {
    api.addEventListener("tokenfuse.stats", onStats);
    api.addEventListener("execution_start", onExecutionStart);
  },

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE_TYPE) return;
    const proto = nodeType.prototype;

    const onNodeCreated = proto.onNodeCreated;
    proto.onNodeCreated = function (...args) {
      const r = onNodeCreated?.apply(this, args);
      try {
        watchWidgets(this);
        if (typeof this.addCustomWidget === "function" && !this.widgets?.some((w) => w?.name === CHART_WIDGET)) {
          this.addCustomWidget(chartWidget());
        }
        const min = this.computeSize?.();
        if (min) {
          const w = Math.max(this.size?.[0] ?? 0, min[0] ?? 280);
          const h = Math.max(this.size?.[1] ?? 0, min[1] ?? PANEL_H);
          this.setSize?.([w, h]);
        }
      } catch (err) {
        warnOnce(err);
      }
      return r;
    };
  },
});
