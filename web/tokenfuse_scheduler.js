// TokenSchedulerController in the browser: a chart of the per-block ratio pyramid that follows the widgets, and
// live token counts / step time / peak memory while sampling, then the run's summary.
//
// Live stats arrive as `tokenfuse.stats` websocket events; their payload is documented in ./lib/stats.js and
// ./README.md. Every access to node state is guarded: widgets may be missing, renamed or converted to inputs.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { chartFamily, MAX_RATIO, pyramidSeries, resolveSchedule } from "./lib/pyramid.js";
import { levelLabel, normalizeStats, removedFraction, StatsBook, statsLines } from "./lib/stats.js";
import { isOpenWorkflowOf, openWorkflowOf, pagePrompts, wrapQueuePrompt } from "./lib/prompts.js";
import { columnBars, levelColor, rowBars, windowSpan } from "./lib/layout.js";
import { chartHeader, chartNote, DIT_LEGEND, familyFromModelName, legendText, linkedWidgets, percentText, wrapText } from "./lib/labels.js";

const NODE_TYPE = "TokenFuseTokenSchedulerController";
const LINE = 13; // px per text line at the chart's 10 px font
const CHART_H = 172; // header (2 lines), bars with their numbers, active-steps strip, note, legend
const PANEL_H = 300; // chart + live stats (progress, summary up to 3 lines, up to 4 level rows) + padding
const SUMMARY_LINES = 3;
const MODEL_HOPS = 8; // how far upstream (LoRA loaders, patches) the chart looks for the checkpoint name
const CHART_WIDGET = "tokenfuse_chart";
const WATCHED = ["preset", "strategy", "ratio", "schedule_text"]; // nodes/scheduler_node.py widgets
const TEXT = "#b8b8b8";
const DIM = "#6c6c6c";
const TRACK = "rgba(255,255,255,0.08)";

const book = new StatsBook(pagePrompts); // live stats per workflow tab and node id (./lib/stats.js)
const ANY_WORKFLOW = "tokenfuse:no-workflow-store"; // frontends without a workflow store: one page, one workflow
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

function isController(node) {
  return node?.comfyClass === NODE_TYPE || node?.type === NODE_TYPE;
}

/** The open workflow tab (the frontend's workflow object; one key for the page on frontends without tabs). */
function openWorkflow() {
  return openWorkflowOf(app, ANY_WORKFLOW);
}

/** The numbers a controller of the open workflow shows (its own workflow's runs only). */
function statsOf(node) {
  const inRoot = !node?.graph || node.graph === app?.graph || node.graph?.isRootGraph === true;
  return book.get(openWorkflow(), node?.id, inRoot);
}

function redrawCanvas() {
  app?.graph?.setDirtyCanvas?.(true, true);
}

function text(ctx, s, x, y, color = TEXT, align = "left") {
  ctx.fillStyle = color;
  ctx.textAlign = align;
  ctx.fillText(s, x, y);
}

function linkById(graph, id) {
  if (id === null || id === undefined || !graph) return null;
  const links = graph.links;
  return graph.getLink?.(id) ?? (typeof links?.get === "function" ? links.get(id) : links?.[id]) ?? null;
}

/** The checkpoint / UNet file name upstream of the node's model input (through LoRA loaders and patches). */
function upstreamModelName(node) {
  let current = node;
  for (let hop = 0; hop < MODEL_HOPS && current; hop++) {
    const graph = current.graph ?? app?.graph;
    const input = (current.inputs ?? []).find((i) => i?.type === "MODEL" && i.link !== null && i.link !== undefined);
    const link = linkById(graph, input?.link);
    const origin = link ? graph?.getNodeById?.(link.origin_id) : null;
    if (!origin) return null;
    const name = (origin.widgets ?? []).map((w) => w?.value).find((v) => typeof v === "string" && /\.(safetensors|ckpt|pt|pth|gguf|sft|bin)$/i.test(v));
    if (name) return name;
    current = origin;
  }
  return null;
}

// run (prompt id + node id) -> the checkpoint name upstream when its numbers were first drawn
const modelOfRun = new Map();
const RUNS_KEPT = 256;

/** Whether the node's model input still comes from the checkpoint its last run sampled. */
function sameModelAsRun(node, stats, name) {
  const key = `${stats.promptId ?? ""}|${stats.node ?? ""}|${node?.id}`;
  if (!modelOfRun.has(key)) {
    modelOfRun.set(key, name);
    if (modelOfRun.size > RUNS_KEPT) modelOfRun.delete(modelOfRun.keys().next().value);
  }
  return modelOfRun.get(key) === name;
}

/** {family, source}: the last run's levels win (unless the checkpoint changed since), then the checkpoint's name,
 * then SD1.5. */
function familyOf(node, values, stats) {
  const name = upstreamModelName(node);
  if (stats?.levels?.length && sameModelAsRun(node, stats, name)) {
    return { family: chartFamily(undefined, stats.levels), source: "run" };
  }
  const widget = values.family ?? values.model_family;
  if (widget === "sd15" || widget === "sdxl" || widget === "dit") return { family: widget, source: "checkpoint" };
  const guess = familyFromModelName(name);
  return guess ? { family: guess, source: "checkpoint" } : { family: "sd15", source: "default" };
}

function measureWith(ctx) {
  return (str) => ctx.measureText(str).width;
}

function drawPyramid(ctx, rect, node, values, stats, linked = []) {
  const { family, source } = familyOf(node, values, stats);
  const schedule = resolveSchedule(values, family);
  const series = pyramidSeries(schedule, family);
  const shown = schedule.widgetValues ?? values; // with the widgets a schedule_text sets by name ({"ratio": 0.5})
  const header = wrapText(chartHeader(schedule, shown, family, source), rect.w, measureWith(ctx)).slice(0, 2);
  header.forEach((ln, i) => text(ctx, ln, rect.x, rect.y + 10 + i * LINE));
  const top = rect.y + 2 * LINE + 4;
  const noteH = LINE * 2 + 8; // strip, then the note line and the legend line, each on its own line
  const chart = { x: rect.x, y: top + 11, w: rect.w, h: rect.h - (top - rect.y) - 11 - noteH };
  ctx.fillStyle = TRACK;
  ctx.fillRect(chart.x, chart.y, chart.w, chart.h);
  const bars = columnBars(
    series.map((b) => b.ratio),
    chart,
    { gap: 2, maxValue: MAX_RATIO },
  );
  ctx.save();
  ctx.font = "9px sans-serif";
  bars.forEach((b, i) => {
    ctx.fillStyle = levelColor(series[i].level);
    ctx.fillRect(b.x, b.y, b.w, Math.max(b.h, series[i].ratio > 0 ? 1 : 0));
    // the number on each bar: % of that block's tokens removed (8/6/4 GB presets differ here)
    if (b.w >= 11) text(ctx, percentText(series[i].ratio), b.x + b.w / 2, b.y - 2, "#d8d8d8", "center");
  });
  ctx.restore();
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
  // Sampling window in which the schedule is active.
  const strip = { x: rect.x, y: chart.y + chart.h + 4, w: rect.w, h: 4 };
  ctx.fillStyle = TRACK;
  ctx.fillRect(strip.x, strip.y, strip.w, strip.h);
  const span = windowSpan(schedule.startPercent, schedule.endPercent, strip);
  ctx.fillStyle = "#8a8ad8";
  ctx.fillRect(span.x, span.y, span.w, span.h);
  // The note: a refused schedule_text or a linked input takes the legend's line too when it needs it.
  const note = chartNote(schedule, linked);
  const noteLines = wrapText(note.text, rect.w, measureWith(ctx));
  const noteY = strip.y + 4 + LINE - 2;
  const legendY = strip.y + 4 + 2 * LINE - 2;
  const noteColor = { error: "#d08a7a", warn: "#e0a84f", info: DIM }[note.level];
  text(ctx, noteLines[0] ?? "", rect.x, noteY, noteColor);
  if (note.level !== "info" && noteLines.length > 1) {
    const second = noteLines.length > 2 ? `${wrapText(noteLines.slice(1).join(" "), rect.w - 12, measureWith(ctx))[0]} …` : noteLines[1];
    text(ctx, second, rect.x, legendY, noteColor);
    return;
  }
  if (family === "dit") {
    // one bar, no U-Net levels: say so rather than a legend of levels
    const fitted = wrapText(DIT_LEGEND, rect.w, measureWith(ctx))[0] ?? "";
    text(ctx, fitted === DIT_LEGEND ? fitted : `${fitted}…`, rect.x, legendY, DIM);
    return;
  }
  // Legend on its own line: the level colours and what /8 … /64 means.
  const levels = [...new Set(series.map((b) => b.level))].sort((a, b) => a - b);
  let x = rect.x;
  for (const lv of levels) {
    ctx.fillStyle = levelColor(lv);
    ctx.fillRect(x, legendY - 7, 7, 7);
    x += 9;
    text(ctx, `/${lv}`, x, legendY, levelColor(lv));
    x += ctx.measureText(`/${lv}`).width + 6;
  }
  const legend = legendText(levels).replace(/^colour = /, "= ");
  const fitted = wrapText(legend, rect.x + rect.w - x, measureWith(ctx))[0] ?? "";
  text(ctx, fitted === legend ? legend : `${fitted}…`, x, legendY, DIM);
}

function drawStats(ctx, rect, stats) {
  if (!stats) {
    text(ctx, "live per-level token counts appear here while sampling", rect.x, rect.y + 12, DIM);
    return;
  }
  const [progress, summary] = statsLines(stats);
  const lines = [{ s: progress, color: TEXT }];
  if (summary) {
    const wrapped = wrapText(summary, rect.w, measureWith(ctx));
    const shown = wrapped.slice(0, SUMMARY_LINES);
    if (wrapped.length > SUMMARY_LINES) shown[SUMMARY_LINES - 1] += " …";
    for (const s of shown) lines.push({ s, color: "#d0d0a0" });
  }
  lines.forEach((ln, i) => text(ctx, ln.s, rect.x, rect.y + 12 + i * LINE, ln.color));
  const top = rect.y + 8 + lines.length * LINE;
  const rows = rowBars(
    stats.levels.map(removedFraction),
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
    const chart = { x: rect.x, y: rect.y, w: rect.w, h: CHART_H };
    const stats = statsOf(node);
    // a widget converted to an input and linked: the run uses the linked value, not the widget's
    const linked = linkedWidgets(node.inputs, WATCHED);
    const values = widgetValues(node);
    if (linked.includes("schedule_text")) delete values.schedule_text;
    drawPyramid(ctx, chart, node, values, stats, linked);
    const statsRect = { x: rect.x, y: rect.y + CHART_H + 6, w: rect.w, h: rect.h - CHART_H - 6 };
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

/** The numbers of closed workflow tabs go (a long session opens and closes many). */
function forgetClosedTabs() {
  book.retain((workflow) => isOpenWorkflowOf(app, workflow, ANY_WORKFLOW));
}

function onStats(event) {
  const stats = normalizeStats(event?.detail);
  if (!stats) return;
  const open = openWorkflow();
  const filed = book.add(stats, open);
  forgetClosedTabs();
  if (filed === open) redrawCanvas();
}

function onExecutionStart(event) {
  const open = openWorkflow();
  const started = book.start(event?.detail?.prompt_id, open);
  forgetClosedTabs();
  if (started === open) redrawCanvas();
}

app.registerExtension({
  name: "tokenfuse.scheduler",

  setup() {
    api.addEventListener("tokenfuse.stats", onStats);
    api.addEventListener("execution_start", onExecutionStart);
    api.addEventListener("reconnecting", () => {
      book.stopRunning("server connection lost");
      redrawCanvas();
    });
    try {
      wrapQueuePrompt(api, openWorkflow); // which tab queued each prompt (./lib/prompts.js)
    } catch (err) {
      warnOnce(err);
    }
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
