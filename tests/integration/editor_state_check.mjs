// What a user meets in the editor around TokenFuse's canvas widgets, against a running ComfyUI (headless Chromium):
// schedule_text the server would refuse, two workflow tabs sharing one websocket, widgets fed by links, a node
// inside a subgraph after undo. Each scenario runs in a fresh page; what the widgets draw is recorded by calling
// their draw() with a canvas context that keeps every fillText.
//
// usage: node tests/integration/editor_state_check.mjs <comfyui base url> '<json: {"schedule_texts": [...]}>'
// env:   PLAYWRIGHT_CORE_DIR, CHROMIUM as for browser_check.mjs
// Prints one JSON object: {scenario: result, ..., errors: [...]} (console errors and page errors from the pack).

import { createRequire } from "node:module";
import path from "node:path";

const [base, argJson] = process.argv.slice(2);
if (!base) {
  console.error("usage: editor_state_check.mjs <base url> [json args]");
  process.exit(2);
}
const args = JSON.parse(argJson || "{}");
const require = createRequire(
  process.env.PLAYWRIGHT_CORE_DIR ? path.join(process.env.PLAYWRIGHT_CORE_DIR, "package.json") : import.meta.url,
);
const { chromium } = require("playwright-core");

// Shared by every scenario (runs in the page).
const PRELUDE = `
const { app } = window;
const { api } = await import("/scripts/api.js");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const wfs = app.extensionManager.workflow;
const recorder = () => {
  const texts = [];
  const c = document.createElement("canvas").getContext("2d");
  return new Proxy(c, {
    get(t, k) { if (k === "fillText") return (s) => texts.push(String(s)); if (k === "texts") return texts; const v = t[k]; return typeof v === "function" ? v.bind(t) : v; },
    set(t, k, v) { t[k] = v; return true; },
  });
};
const drawn = (node, widget) => { const w = node.widgets.find((x) => x.name === widget); const ctx = recorder(); w.draw(ctx, node, 420, 100); return ctx.texts; };
const add = (type, x = 60) => { const n = LiteGraph.createNode(type); n.pos = [x, 60]; app.graph.add(n); wfs.activeWorkflow?.changeTracker?.checkState?.(); return n; };
const find = (type) => app.graph.nodes.find((n) => n.type === type);
// app.queuePrompt with the server's answer stubbed (a lone node is not a valid prompt): as the Queue button does it
const queueAs = async (promptId) => {
  const fetchApi = api.fetchApi;
  api.fetchApi = async (route, opts) => route === "/prompt"
    ? new Response(JSON.stringify({ prompt_id: promptId, number: 1, node_errors: {} }), { status: 200 })
    : fetchApi.call(api, route, opts);
  try { await app.queuePrompt(0, 1); } finally { api.fetchApi = fetchApi; }
};
const newTab = async () => { await app.extensionManager.command.execute("Comfy.NewBlankWorkflow"); await sleep(300); app.graph.clear(); };
const previousTab = async () => { await app.extensionManager.command.execute("Workspace.PreviousOpenedWorkflow"); await sleep(500); };
const rebuild = async () => { await app.loadGraphData(JSON.parse(JSON.stringify(app.graph.serialize())), false, false, wfs.activeWorkflow); await sleep(200); };
app.graph.clear();
`;

const SCENARIOS = {
  // The chart's note for each schedule_text (all drawn text, joined): what the server would refuse is named.
  scheduleText: `
    const node = add("TokenFuseTokenSchedulerController");
    const w = node.widgets.find((x) => x.name === "schedule_text");
    const out = {};
    for (const t of ARGS.schedule_texts) { w.value = t; out[t] = drawn(node, "tokenfuse_chart").join(" "); }
    return out;`,

  // Tab A queued a run; its live stats arrive while tab B (same node id) is open.
  tabsStats: `
    const a = add("TokenFuseTokenSchedulerController");
    await queueAs("prompt-A");
    await newTab();
    const b = add("TokenFuseTokenSchedulerController");
    api.dispatchCustomEvent("execution_start", { prompt_id: "prompt-A", timestamp: Date.now() });
    api.dispatchCustomEvent("tokenfuse.stats", {
      node: String(a.id), prompt_id: "prompt-A", step: 7, steps: 20, step_time_s: 0.4, peak_mem_mb: null,
      levels: [{ level: 8, tokens_in: 4096, tokens_out: 1024 }], final: false, summary: null,
    });
    const live = (n) => drawn(n, "tokenfuse_chart").filter((s) => /^(step|done) /.test(s));
    const out = { sameId: a.id === b.id, tabB: live(b) };
    await previousTab();
    out.tabA = live(find("TokenFuseTokenSchedulerController"));
    await rebuild(); // undo/redo rebuild the node objects the same way
    out.tabAAfterUndo = live(find("TokenFuseTokenSchedulerController"));
    return out;`,

  // Tab A queued a run; ScheduledFusion's report arrives (real event order) while tab B is open.
  tabsReport: `
    const T = "TokenFuseScheduledFusion";
    const a = add(T);
    await queueAs("prompt-A");
    await newTab();
    const b = add(T);
    await queueAs("prompt-B");
    api.dispatchCustomEvent("execution_start", { prompt_id: "prompt-B", timestamp: 1 });
    api.dispatchCustomEvent("executing", String(b.id));
    api.dispatchCustomEvent("executed", { node: String(b.id), display_node: String(b.id), output: { text: ["ScheduledFusion: tab B's run"] }, prompt_id: "prompt-B" });
    api.dispatchCustomEvent("executing", null);
    const out = { sameId: a.id === b.id, tabBBefore: drawn(b, "tokenfuse_report") };
    api.dispatchCustomEvent("execution_start", { prompt_id: "prompt-A", timestamp: 2 });
    api.dispatchCustomEvent("executing", String(a.id));
    api.dispatchCustomEvent("executed", { node: String(a.id), display_node: String(a.id), output: { text: ["ScheduledFusion: tab A's run"] }, prompt_id: "prompt-A" });
    api.dispatchCustomEvent("executing", null);
    out.tabBDuringA = drawn(b, "tokenfuse_report");
    await previousTab();
    out.tabA = drawn(find(T), "tokenfuse_report");
    return out;`,

  // schedule_text and ratio converted to inputs and linked: the chart cannot know the values the run will use.
  linkedInputs: `
    const node = add("TokenFuseTokenSchedulerController");
    node.widgets.find((x) => x.name === "schedule_text").value = '{"protect_blocks": 99}';
    const text = add("PrimitiveStringMultiline", 600);
    text.widgets[0].value = '{"ratios": {"8": 0.1}}';
    text.connect(0, node, node.inputs.findIndex((i) => i.name === "schedule_text"));
    const ratio = add("PrimitiveFloat", 600);
    ratio.widgets[0].value = 0.2;
    ratio.connect(0, node, node.inputs.findIndex((i) => i.name === "ratio"));
    return { drawn: drawn(node, "tokenfuse_chart").join(" ") };`,

  // An SDXL run, then the user picks an SD1.5 checkpoint: the chart's family before and after.
  familyAfterCheckpointChange: `
    const node = add("TokenFuseTokenSchedulerController");
    const ckpt = add("CheckpointLoaderSimple", -400);
    const name = ckpt.widgets.find((w) => w.name === "ckpt_name");
    name.value = "sd_xl_base_1.0.safetensors";
    ckpt.connect(0, node, node.inputs.findIndex((i) => i.type === "MODEL"));
    const header = () => drawn(node, "tokenfuse_chart")[0];
    const out = { beforeRun: header() };
    api.dispatchCustomEvent("tokenfuse.stats", {
      node: String(node.id), prompt_id: "p-xl", step: 20, steps: 20, step_time_s: 0.4, peak_mem_mb: null,
      levels: [{ level: 16, tokens_in: 4096, tokens_out: 1024 }, { level: 32, tokens_in: 1024, tokens_out: 512 }],
      final: true, summary: "TokenFuse: SDXL run",
    });
    out.afterRun = header();
    name.value = "v1-5-pruned-emaonly.safetensors";
    out.afterChange = header();
    return out;`,

  // A DiT run (its stats report the one level 0): what the chart and the live rows say.
  ditChart: `
    const node = add("TokenFuseTokenSchedulerController");
    api.dispatchCustomEvent("tokenfuse.stats", {
      node: String(node.id), prompt_id: "p-dit", step: 4, steps: 20, step_time_s: 0.4, peak_mem_mb: null,
      levels: [{ level: 0, tokens_in: 4096, tokens_out: 2048 }], final: false, summary: null,
    });
    return { drawn: drawn(node, "tokenfuse_chart") };`,

  // The tab's run had the controller; the next run of the same tab does not reach it (bypassed): its summary stays.
  runWithoutController: `
    const node = add("TokenFuseTokenSchedulerController");
    await queueAs("p-with");
    api.dispatchCustomEvent("execution_start", { prompt_id: "p-with", timestamp: 1 });
    api.dispatchCustomEvent("tokenfuse.stats", {
      node: String(node.id), prompt_id: "p-with", step: 20, steps: 20, step_time_s: 0.4, peak_mem_mb: null,
      levels: [], final: true, summary: "TokenFuse: the run with the node", status: "complete",
    });
    node.mode = 4;
    await queueAs("p-without");
    api.dispatchCustomEvent("execution_start", { prompt_id: "p-without", timestamp: 2 });
    api.dispatchCustomEvent("executing", null);
    return { drawn: drawn(node, "tokenfuse_chart") };`,

  // What the pack asks the workflow store when it forgets a closed tab's numbers.
  closedTab: `
    const a = wfs.activeWorkflow;
    await newTab();
    const out = { isOpenFn: typeof wfs.isOpen, openBefore: wfs.isOpen(a) };
    await wfs.closeWorkflow(a);
    out.openAfter = wfs.isOpen(a);
    out.activeOpen = wfs.isOpen(wfs.activeWorkflow);
    return out;`,

  // A CPU run's live stats (peak = process peak RSS) on a node of the default width: everything drawn.
  cpuStatsDefaultWidth: `
    const node = add("TokenFuseTokenSchedulerController");
    api.dispatchCustomEvent("tokenfuse.stats", {
      node: String(node.id), prompt_id: null, step: 3, steps: 20, step_time_s: 0.4, peak_mem_mb: 950.4,
      peak_mem_kind: "rss", levels: [{ level: 8, tokens_in: 4096, tokens_out: 1024 }], final: false, summary: null,
    });
    const w = node.widgets.find((x) => x.name === "tokenfuse_chart");
    const ctx = recorder();
    w.draw(ctx, node, node.size[0], 100);
    return { width: node.size[0], drawn: ctx.texts };`,

  // PatchTokenize made in the editor, then run three times (the same workflow queued again): its size after each run.
  planPreviewRuns: `
    const plan = add("TokenFusePatchTokenize");
    await sleep(100);
    const c = document.createElement("canvas");
    c.width = 96;
    c.height = 64;
    const blob = await new Promise((r) => c.toBlob(r, "image/png"));
    const form = new FormData();
    form.append("image", blob, "tokenfuse_state_check.png");
    form.append("type", "temp");
    form.append("overwrite", "true");
    const info = await (await api.fetchApi("/upload/image", { method: "POST", body: form })).json();
    const output = { images: [{ filename: info.name, subfolder: "", type: "temp" }], text: ["PatchTokenize: 40% fewer tokens than uniform"] };
    const sizes = [Array.from(plan.size)];
    for (let i = 0; i < 3; i++) {
      api.dispatchCustomEvent("executed", { node: String(plan.id), display_node: String(plan.id), output, prompt_id: "p" + i });
      await sleep(800);
      app.canvas.draw(true, true);
      sizes.push(Array.from(plan.size));
    }
    return { sizes, imgs: plan.imgs?.length ?? 0 };`,

  // ScheduledFusion inside a subgraph: its report after undo (the node objects are rebuilt).
  subgraphReport: `
    const T = "TokenFuseScheduledFusion";
    const root = add(T);
    const inner = add(T, 600);
    const { node: sgNode } = app.graph.convertToSubgraph(new Set([inner]));
    const innerNow = sgNode.subgraph.nodes.find((n) => n.type === T);
    api.dispatchCustomEvent("execution_start", { prompt_id: "p-sg", timestamp: 1 });
    api.dispatchCustomEvent("executed", { node: sgNode.id + ":" + innerNow.id, display_node: sgNode.id + ":" + innerNow.id, output: { text: ["ScheduledFusion: inside the subgraph"] }, prompt_id: "p-sg" });
    api.dispatchCustomEvent("executed", { node: String(root.id), display_node: String(root.id), output: { text: ["ScheduledFusion: in the root graph"] }, prompt_id: "p-sg" });
    const out = { before: drawn(innerNow, "tokenfuse_report") };
    await rebuild();
    const sg = app.graph.nodes.find((n) => n.isSubgraphNode?.()).subgraph;
    out.afterUndo = drawn(sg.nodes.find((n) => n.type === T), "tokenfuse_report");
    out.rootAfterUndo = drawn(find(T), "tokenfuse_report");
    return out;`,
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const result = { errors: [] };
try {
  for (const [name, body] of Object.entries(SCENARIOS)) {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    page.on("console", (m) => {
      const line = `${name}: ${m.text()} @ ${m.location()?.url ?? ""}`;
      if (m.type() === "error" || (m.type() === "warning" && /tokenfuse/i.test(line))) result.errors.push(line);
    });
    page.on("pageerror", (e) => result.errors.push(`${name}: ${String(e?.stack ?? e)}`));
    try {
      await page.goto(base, { waitUntil: "domcontentloaded", timeout: 90_000 });
      await page.waitForFunction(() => window.app?.graph && window.LiteGraph && window.app.extensionManager?.workflow, null, { timeout: 90_000 });
      await page.waitForTimeout(1000);
      for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
      result[name] = await page.evaluate(`(async () => { const ARGS = ${JSON.stringify(args)}; ${PRELUDE} ${body} })()`);
    } catch (err) {
      result[name] = { fatal: String(err?.stack ?? err) };
    } finally {
      await page.close();
    }
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(result, null, 1));
