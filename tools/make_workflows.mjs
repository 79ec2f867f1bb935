// Build, save and check the example workflows with the real ComfyUI frontend (headless Chromium + Playwright).
//
// usage: node tools/make_workflows.mjs make  <comfyui url> <out dir>   writes <name>.json (what "Save" writes) and
//                                                                       <name>.jpg (downscaled editor screenshot)
//        node tools/make_workflows.mjs check <comfyui url> <dir>       loads every <dir>/*.json, prints one JSON
//                                                                       object: missing node types, round trip,
//                                                                       API prompt (app.graphToPrompt) per file
// The server must have this pack loaded (see README "Workflows"). Graphs are built with LiteGraph.createNode and
// node.connect in the page, never by writing widget lists by hand.
// env: PLAYWRIGHT_CORE_DIR (folder with node_modules/playwright-core), CHROMIUM (default /usr/bin/chromium)

import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { WORKFLOWS } from "./workflow_specs.mjs";

const [mode, base, dir] = process.argv.slice(2);
if (!["make", "check"].includes(mode) || !base || !dir) {
  console.error("usage: make_workflows.mjs make|check <comfyui url> <dir>");
  process.exit(2);
}
const require = createRequire(
  process.env.PLAYWRIGHT_CORE_DIR ? path.join(process.env.PLAYWRIGHT_CORE_DIR, "package.json") : import.meta.url,
);
const { chromium } = require("playwright-core");

const THUMB_WIDTH = 720;

async function openEditor(browser) {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e?.stack ?? e)));
  page.on("console", (m) => m.type() === "error" && errors.push(`${m.text()} @ ${m.location()?.url ?? ""}`));
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 90_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 90_000 });
  await page.waitForTimeout(1500);
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
  return { page, errors };
}

/** In the page: build one spec into app.graph, lay it out in columns, return app.graph.serialize(). */
async function build(page, spec) {
  return page.evaluate(async (spec) => {
    const { app, LiteGraph } = window;
    app.graph.clear();
    app.canvas.show_info = false; // no FPS/stats overlay in the thumbnail
    const made = {};
    const problems = [];
    for (const [key, s] of Object.entries(spec.nodes)) {
      const node = LiteGraph.createNode(s.type);
      if (!node) throw new Error(`node type ${s.type} is not registered (is the pack loaded?)`);
      if (s.title) node.title = s.title;
      app.graph.add(node);
      for (const [name, value] of Object.entries(s.widgets ?? {})) {
        const w = node.widgets?.find((x) => x.name === name);
        if (!w) { problems.push(`${key}: no widget ${name}`); continue; }
        w.value = value;
      }
      if (s.size) node.size = [...s.size];
      made[key] = node;
    }
    for (const [from, out, to, inp] of spec.links) {
      const a = made[from], b = made[to];
      const o = a.outputs.findIndex((x) => x.name === out);
      const i = b.inputs.findIndex((x) => x.name === inp);
      if (o < 0 || i < 0) { problems.push(`link ${from}.${out} -> ${to}.${inp}: slot missing`); continue; }
      if (!a.connect(o, b, i)) problems.push(`link ${from}.${out} -> ${to}.${inp} refused`);
    }
    if (problems.length) throw new Error(problems.join("; "));
    // Columns left to right, nodes stacked in spec order.
    const cols = {};
    for (const [key, s] of Object.entries(spec.nodes)) (cols[s.col] ??= []).push(made[key]);
    let x = 40;
    for (const c of Object.keys(cols).map(Number).sort((p, q) => p - q)) {
      let y = 60;
      for (const n of cols[c]) {
        n.pos = [x, y];
        y += n.size[1] + LiteGraph.NODE_TITLE_HEIGHT + 30;
      }
      x += Math.max(...cols[c].map((n) => n.size[0])) + 50;
    }
    // Fit the whole graph into the canvas for the thumbnail (and the view saved with the workflow).
    let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
    for (const n of app.graph.nodes) {
      x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT);
      x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
    }
    const cw = app.canvas.canvas.clientWidth, ch = app.canvas.canvas.clientHeight;
    const scale = Math.min((cw - 40) / (x1 - x0), (ch - 40) / (y1 - y0), 1);
    app.canvas.ds.scale = scale;
    app.canvas.ds.offset = [20 / scale - x0, 20 / scale - y0];
    app.graph.setDirtyCanvas(true, true);
    return JSON.parse(JSON.stringify(app.graph.serialize()));
  }, spec);
}

/** Screenshot the canvas area and downscale it to a JPEG in the page. */
async function thumbnail(page, file) {
  await page.waitForTimeout(600);
  const box = await page.evaluate(() => {
    // the graph's bounding box on screen (canvas coords -> CSS pixels), so the thumbnail holds no empty canvas
    const { app, LiteGraph } = window;
    const r = app.canvas.canvas.getBoundingClientRect();
    const { scale, offset } = app.canvas.ds;
    let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
    for (const n of app.graph.nodes) {
      x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT);
      x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
    }
    const sx = (x) => r.x + (x + offset[0]) * scale, sy = (y) => r.y + (y + offset[1]) * scale;
    const left = Math.max(r.x, sx(x0) - 12), top = Math.max(r.y, sy(y0) - 12);
    return { x: left, y: top, width: Math.min(r.right, sx(x1) + 12) - left, height: Math.min(r.bottom, sy(y1) + 12) - top };
  });
  const png = await page.screenshot({ clip: box });
  const b64 = await page.evaluate(async ([data, width]) => {
    const img = new Image();
    img.src = `data:image/png;base64,${data}`;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = width;
    c.height = Math.round((img.height * width) / img.width);
    c.getContext("2d").drawImage(img, 0, 0, c.width, c.height);
    return c.toDataURL("image/jpeg", 0.85).split(",")[1];
  }, [png.toString("base64"), THUMB_WIDTH]);
  writeFileSync(file, Buffer.from(b64, "base64"));
}

/** In the page: load a saved workflow, report missing types, the round trip and the API prompt. */
async function check(page, name, workflow) {
  return page.evaluate(async ([name, wf]) => {
    const { app, LiteGraph } = window;
    const missing = [...new Set(wf.nodes.map((n) => n.type).filter((t) => !LiteGraph.registered_node_types[t]))];
    await app.loadGraphData(structuredClone(wf), true, true, name);
    const loaded = app.graph.nodes.map((n) => ({ id: n.id, type: n.type }));
    const saved = JSON.parse(JSON.stringify(app.graph.serialize()));
    const byId = Object.fromEntries(saved.nodes.map((n) => [n.id, n]));
    const changed = wf.nodes
      .filter((n) => JSON.stringify(byId[n.id]?.widgets_values ?? null) !== JSON.stringify(n.widgets_values ?? null))
      .map((n) => ({ id: n.id, type: n.type, file: n.widgets_values, now: byId[n.id]?.widgets_values }));
    const prompt = await app.graphToPrompt();
    const templates = await (await fetch("/api/workflow_templates")).json();
    return { missing, loaded, changed, links: saved.links.length, prompt: prompt.output, templates };
  }, [name, workflow]);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
let code = 0;
try {
  const { page, errors } = await openEditor(browser);
  if (mode === "make") {
    for (const spec of WORKFLOWS) {
      const graph = await build(page, spec);
      writeFileSync(path.join(dir, `${spec.name}.json`), `${JSON.stringify(graph, null, 2)}\n`);
      await thumbnail(page, path.join(dir, `${spec.name}.jpg`));
      console.error(`wrote ${spec.name}.json (${graph.nodes.length} nodes, ${graph.links.length} links) + .jpg`);
    }
    console.log(JSON.stringify({ made: WORKFLOWS.map((s) => s.name), errors }));
  } else {
    const results = {};
    for (const f of readdirSync(dir).filter((x) => x.endsWith(".json")).sort()) {
      results[f] = await check(page, f, JSON.parse(readFileSync(path.join(dir, f), "utf8")));
    }
    console.log(JSON.stringify({ results, errors }));
  }
} catch (err) {
  console.error(String(err?.stack ?? err));
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
