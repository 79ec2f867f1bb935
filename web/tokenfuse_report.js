// What a TokenFuse node says about its run, inside the node: ScheduledFusion's per-face report (fallbacks,
// warnings), Blend's pasted count or pass-through warning, PatchTokenize's expected token saving, FaceTrack's and
// VideoFaceFusion's reports.
//
// The nodes return {"ui": {"text": [...]}}; ComfyUI sends it to the editor as the node's `executed` message. The
// panel is a canvas widget (not serialized) of fixed height, reserved when the node is created, so a run never
// makes the node grow into its neighbours (the example workflows are laid out for these sizes). Lines that need
// attention are drawn in amber; what does not fit is counted ("… 3 more lines: see the report output").

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { reportLines, wrapText } from "./lib/labels.js";
import { forgetClosed, isOpenWorkflowOf, openWorkflowOf, pagePrompts, touch, wrapQueuePrompt } from "./lib/prompts.js";

const LINE = 13;
const WIDGET = "tokenfuse_report";
// node type -> lines reserved for its report, and what the panel says before the first run
const PANELS = {
  TokenFuseScheduledFusion: { lines: 12, idle: "per-face report (seed, tokens, time, fallbacks) appears here after a run" },
  TokenFuseBlend: { lines: 4, idle: "after a run: faces pasted, or a warning when the photo passed through", log: true },
  TokenFusePatchTokenize: { lines: 2, idle: "after a run: the expected token saving of this plan" },
  TokenFuseFaceTrack: { lines: 5, idle: "after a run: frames, scene cuts, tracks kept, crop jitter raw -> smoothed" },
  TokenFuseVideoFaceFusion: { lines: 6, idle: "after a run: frames, key frames, diffusion runs, time per frame, warnings" },
};
const COLORS = { text: "#c8c8c8", warn: "#e0a84f", dim: "#6c6c6c" };
const lastReport = new WeakMap(); // node -> [{text, warn}]
const ANY_WORKFLOW = "tokenfuse:no-workflow-store";
// per workflow tab: node keys whose report was cleared when its run started and has not come back yet (their last
// outputs are stale)
const cleared = new Map();

function openWorkflow() {
  return openWorkflowOf(app, ANY_WORKFLOW);
}

function clearedOf(workflow) {
  if (!touch(cleared, workflow)) {
    cleared.set(workflow, new Set());
    forgetClosedTabs();
  }
  return cleared.get(workflow);
}

// closed tabs' entries go (and the least recently used beyond a bound): a long session opens and closes many tabs
function forgetClosedTabs() {
  forgetClosed(cleared, (workflow) => isOpenWorkflowOf(app, workflow, ANY_WORKFLOW));
}

function inRoot(node) {
  return !node?.graph || node.graph === app.graph || node.graph?.isRootGraph === true;
}

// The key of a node's outputs in app.nodeOutputs: its id in the root graph, "<subgraph id>:<id>" inside a subgraph
// (the frontend's node locator); a node inside a subgraph never reads the root node with the same id.
function outputKey(node) {
  return inRoot(node) ? String(node.id) : `${node.graph?.id}:${node.id}`;
}

// Undo/redo and workflow tabs rebuild the node objects (the WeakMap forgets them); the frontend keeps each node's
// last outputs per workflow, as it does for image previews, so the report is read back from there.
function reportOf(node) {
  const kept = lastReport.get(node);
  if (kept?.length || clearedOf(openWorkflow()).has(outputKey(node))) return kept;
  const lines = reportLines(app.nodeOutputs?.[outputKey(node)]?.text);
  if (lines.length) lastReport.set(node, lines);
  return lines;
}

// every node of the graph and of its subgraphs
function allNodes() {
  const root = app.graph;
  const out = [...(root?.nodes ?? [])];
  const subgraphs = root?.subgraphs;
  if (subgraphs && typeof subgraphs.values === "function") for (const sg of subgraphs.values()) out.push(...(sg?.nodes ?? []));
  return out;
}

function panelWidget(node, panel) {
  return {
    name: WIDGET,
    type: WIDGET,
    value: null,
    serialize: false,
    options: { serialize: false },
    computeSize(width) {
      return [Number.isFinite(width) ? width : 280, panel.lines * LINE + 10];
    },
    draw(ctx, drawNode, width, y) {
      try {
        drawPanel(ctx, drawNode ?? node, panel, { x: 10, y: y + 2, w: (Number.isFinite(width) ? width : 280) - 20, h: panel.lines * LINE + 6 });
      } catch (err) {
        console.warn("[tokenfuse] report panel skipped:", err);
      }
    },
    mouse() {
      return false;
    },
  };
}

function drawPanel(ctx, node, panel, rect) {
  if (node?.flags?.collapsed || !(rect.w > 40)) return;
  ctx.save();
  ctx.beginPath();
  ctx.rect(rect.x - 2, rect.y, rect.w + 4, rect.h);
  ctx.clip();
  ctx.fillStyle = "rgba(0,0,0,0.18)";
  ctx.fillRect(rect.x - 2, rect.y, rect.w + 4, rect.h);
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  const measure = (s) => ctx.measureText(s).width;
  const report = reportOf(node);
  if (!report?.length) {
    ctx.fillStyle = COLORS.dim;
    wrapText(panel.idle, rect.w - 4, measure)
      .slice(0, panel.lines)
      .forEach((ln, i) => ctx.fillText(ln, rect.x + 2, rect.y + 11 + i * LINE));
    ctx.restore();
    return;
  }
  const rows = [];
  for (const line of report) for (const part of wrapText(line.text, rect.w - 4, measure)) rows.push({ text: part, warn: line.warn });
  let shown = rows;
  if (rows.length > panel.lines) {
    shown = rows.slice(0, panel.lines - 1);
    const where = panel.log ? "the server log" : "the report output or the server log";
    shown.push({ text: `… ${rows.length - shown.length} more line(s): see ${where}`, warn: false, dim: true });
  }
  shown.forEach((row, i) => {
    ctx.fillStyle = row.dim ? COLORS.dim : row.warn ? COLORS.warn : COLORS.text;
    ctx.fillText(row.text, rect.x + 2, rect.y + 11 + i * LINE);
  });
  ctx.restore();
}

function addPanel(node, panel) {
  if (typeof node.addCustomWidget !== "function" || node.widgets?.some((w) => w?.name === WIDGET)) return;
  node.addCustomWidget(panelWidget(node, panel));
  const min = node.computeSize?.();
  if (min) node.setSize?.([Math.max(node.size?.[0] ?? 0, min[0]), Math.max(node.size?.[1] ?? 0, min[1])]);
}

app.registerExtension({
  name: "tokenfuse.report",

  setup() {
    // a new run starts with empty panels, so an old report is never mistaken for this run's; only in the tab that
    // queued it (another tab's run leaves this tab's reports alone)
    api.addEventListener("execution_start", (event) => {
      const open = openWorkflow();
      forgetClosedTabs();
      if (pagePrompts.start(event?.detail?.prompt_id, open) !== open) return;
      const ids = clearedOf(open);
      for (const node of allNodes()) {
        if (!PANELS[node?.comfyClass ?? node?.type]) continue;
        ids.add(outputKey(node));
        if (lastReport.delete(node)) node.setDirtyCanvas?.(true, false);
      }
    });
    try {
      wrapQueuePrompt(api, openWorkflow); // which tab queued each prompt (./lib/prompts.js)
    } catch (err) {
      console.warn("[tokenfuse] report panel: queue tracking skipped:", err);
    }
  },

  async beforeRegisterNodeDef(nodeType, nodeData) {
    const panel = PANELS[nodeData?.name];
    if (!panel) return;
    const proto = nodeType.prototype;
    const onNodeCreated = proto.onNodeCreated;
    proto.onNodeCreated = function (...args) {
      const r = onNodeCreated?.apply(this, args);
      try {
        addPanel(this, panel);
      } catch (err) {
        console.warn("[tokenfuse] report panel skipped:", err);
      }
      return r;
    };
    const onExecuted = proto.onExecuted;
    proto.onExecuted = function (message, ...rest) {
      const r = onExecuted?.apply(this, [message, ...rest]);
      try {
        const lines = reportLines(message?.text);
        // The frontend hands a run's output to the node with the same id in the OPEN tab: a run queued from
        // another tab is not this node's (that tab reads its own outputs back when it is opened).
        const open = openWorkflow();
        if (lines.length && pagePrompts.runningWorkflow(open) === open) {
          clearedOf(open).delete(outputKey(this));
          lastReport.set(this, lines);
          this.setDirtyCanvas?.(true, false);
        }
      } catch (err) {
        console.warn("[tokenfuse] report panel skipped:", err);
      }
      return r;
    };
  },
});
