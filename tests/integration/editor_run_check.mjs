// Run a workflow in the real ComfyUI editor the way a user does (Queue button: app.queuePrompt) and print what the
// editor shows: dialogs (missing models on load, the error of a failed run), each node's reported text, and node
// rectangles before and after the run with the pairs that overlap.
//
// usage: node tests/integration/editor_run_check.mjs <comfyui base url> workflow <file.json>
//        node tests/integration/editor_run_check.mjs <comfyui base url> handbuilt <spec json>
//   workflow:  loads the file with app.loadGraphData (as the template browser does) and queues it.
//   handbuilt: builds the graph in the page with LiteGraph.createNode and node.connect, as a user adding nodes from
//              the search box: spec = {"nodes": {key: {type, col, widgets}}, "links": [[from, output, to, input]]};
//              nodes stacked per column 20 px apart at the sizes they have once created, then queued.
// env:   PLAYWRIGHT_CORE_DIR, CHROMIUM (as tests/integration/browser_check.mjs)
// Prints one JSON object: {loadDialogs, status: {ok, error}, dialogs, outputs: {"id:type": text[]}, before, after,
// errors}; before/after: {rects: [[id, type, x, y, w, h]], overlaps: [["id:type", "id:type"]]}.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [base, mode, arg] = process.argv.slice(2);
if (!base || !["workflow", "handbuilt"].includes(mode) || !arg) {
  console.error("usage: editor_run_check.mjs <base url> workflow <file.json> | handbuilt <spec json>");
  process.exit(2);
}
const require = createRequire(
  process.env.PLAYWRIGHT_CORE_DIR ? path.join(process.env.PLAYWRIGHT_CORE_DIR, "package.json") : import.meta.url,
);
const { chromium } = require("playwright-core");

const dialogText = (page) =>
  page.evaluate(() =>
    [...document.querySelectorAll("[role=dialog], [role=alertdialog], .p-toast-message")]
      .map((e) => e.innerText.replace(/\s+/g, " ").trim())
      .filter(Boolean),
  );

const rects = (page) =>
  page.evaluate(() => {
    const { app, LiteGraph } = window;
    const th = LiteGraph.NODE_TITLE_HEIGHT;
    const r = app.graph.nodes.map((n) => [n.id, n.type, n.pos[0], n.pos[1] - th, n.size[0], n.size[1] + th]);
    const overlaps = [];
    for (let i = 0; i < r.length; i++) {
      for (let j = i + 1; j < r.length; j++) {
        const [, ta, ax, ay, aw, ah] = r[i], [, tb, bx, by, bw, bh] = r[j];
        if (ax < bx + bw && bx < ax + aw && ay < by + bh && by < ay + ah) overlaps.push([`${r[i][0]}:${ta}`, `${r[j][0]}:${tb}`]);
      }
    }
    return { rects: r, overlaps };
  });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const out = { errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  page.on("pageerror", (e) => out.errors.push(String(e?.stack ?? e)));
  page.on("console", (m) => m.type() === "error" && out.errors.push(`${m.text()} @ ${m.location()?.url ?? ""}`));
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 240_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 240_000 });
  await page.waitForTimeout(1500);
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
  if (mode === "workflow") {
    const wf = JSON.parse(readFileSync(arg, "utf8"));
    await page.evaluate(async ([name, wf]) => window.app.loadGraphData(wf, true, true, name), [path.basename(arg), wf]);
  } else {
    await page.evaluate(async (spec) => {
      const { app, LiteGraph } = window;
      app.graph.clear();
      const made = {};
      for (const [key, s] of Object.entries(spec.nodes)) {
        const node = LiteGraph.createNode(s.type);
        if (!node) throw new Error(`node type ${s.type} is not registered`);
        app.graph.add(node);
        for (const [name, value] of Object.entries(s.widgets ?? {})) {
          const w = node.widgets?.find((x) => x.name === name);
          if (!w) throw new Error(`${key}: no widget ${name}`);
          w.value = value;
        }
        made[key] = node;
      }
      for (const [from, output, to, input] of spec.links) {
        const a = made[from], b = made[to];
        const o = a.outputs.findIndex((x) => x.name === output);
        const i = b.inputs.findIndex((x) => x.name === input);
        if (o < 0 || i < 0 || !a.connect(o, b, i)) throw new Error(`link ${from}.${output} -> ${to}.${input}`);
      }
      await new Promise((r) => setTimeout(r, 1500)); // sizes settle (image previews of LoadImage, reserved rooms)
      const cols = {};
      for (const [key, s] of Object.entries(spec.nodes)) (cols[s.col] ??= []).push(made[key]);
      let x = 40;
      for (const c of Object.keys(cols).map(Number).sort((p, q) => p - q)) {
        let y = 60;
        for (const n of cols[c]) {
          n.pos = [x, y];
          y += n.size[1] + LiteGraph.NODE_TITLE_HEIGHT + 20;
        }
        x += Math.max(...cols[c].map((n) => n.size[0])) + 40;
      }
      app.graph.setDirtyCanvas(true, true);
    }, JSON.parse(arg));
  }
  await page.waitForTimeout(1500);
  out.loadDialogs = await dialogText(page);
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
  await page.waitForTimeout(500);
  out.before = await rects(page);
  out.status = await page.evaluate(async () => {
    const { app } = window;
    const { api } = await import("/scripts/api.js");
    const finished = new Promise((resolve) => {
      api.addEventListener("execution_success", () => resolve({ ok: true }), { once: true });
      api.addEventListener("execution_error", (e) => resolve({ ok: false, error: e.detail?.exception_message ?? "error", type: e.detail?.exception_type, node_type: e.detail?.node_type }), { once: true });
    });
    await app.queuePrompt(0, 1); // the Queue button
    const timeout = new Promise((r) => setTimeout(() => r({ ok: false, error: "no result in 480 s" }), 480_000));
    return Promise.race([finished, timeout]);
  });
  await page.waitForTimeout(3000); // previews load, dialogs open
  out.dialogs = await dialogText(page);
  out.after = await rects(page);
  out.outputs = await page.evaluate(() => {
    const { app } = window;
    const res = {};
    for (const n of app.graph.nodes) res[`${n.id}:${n.type}`] = app.nodeOutputs?.[String(n.id)]?.text ?? null;
    return res;
  });
  if (process.env.TOKENFUSE_RUN_SHOT) await page.screenshot({ path: process.env.TOKENFUSE_RUN_SHOT });
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
