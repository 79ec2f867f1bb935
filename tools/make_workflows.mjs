// Build, save and check the example workflows with the real ComfyUI frontend (headless Chromium + Playwright).
//
// usage: node tools/make_workflows.mjs make  <comfyui url> <out dir>   writes <name>.json (what "Save" writes)
//        node tools/make_workflows.mjs check <comfyui url> <dir>       loads every <dir>/*.json, prints one JSON
//                                                                       object: missing node types, round trip,
//                                                                       API prompt (app.graphToPrompt) per file
//        node tools/make_workflows.mjs shots <comfyui url> <dir> <out> loads and RUNS every <dir>/*.json in the
//                                                                       editor, saves <out>/<name>.png (1600x1000,
//                                                                       after the run) and prints per file: the
//                                                                       run's status, node rectangles before/after,
//                                                                       overlapping pairs, ui.text per node; and
//                                                                       <out>/<name>.card.jpg, the template card
//                                                                       picture (copy it to workflows/<name>.jpg)
//        (shots needs the server to have the models the workflows name, e.g. random weights; see
//         tests/integration/test_editor_after_run.py. For CPU speed the QUEUED prompt samples small: ScheduledFusion
//         steps 2, guide/max size 64, FaceDetect crop 128, VideoFaceFusion steps 2, guide 64, crf 23 ultrafast; the
//         editor keeps showing the workflow's own settings.)
// The server must have this pack loaded (see README "Workflows"). Graphs are built with LiteGraph.createNode and
// node.connect in the page, never by writing widget lists by hand.
// env: PLAYWRIGHT_CORE_DIR (folder with node_modules/playwright-core), CHROMIUM (default /usr/bin/chromium),
//      TOKENFUSE_WORKFLOWS (check/shots: only the files whose name contains this text; default all)

import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { WORKFLOWS } from "./workflow_specs.mjs";

const [mode, base, dir, outDir] = process.argv.slice(2);
if (!["make", "check", "shots"].includes(mode) || !base || !dir || (mode === "shots" && !outDir)) {
  console.error("usage: make_workflows.mjs make|check <comfyui url> <dir> | shots <comfyui url> <dir> <out dir>");
  process.exit(2);
}
const require = createRequire(
  process.env.PLAYWRIGHT_CORE_DIR ? path.join(process.env.PLAYWRIGHT_CORE_DIR, "package.json") : import.meta.url,
);
const { chromium } = require("playwright-core");
const only = process.env.TOKENFUSE_WORKFLOWS ?? "";
const jsonFiles = (d) => readdirSync(d).filter((x) => x.endsWith(".json") && x.includes(only)).sort();

async function openEditor(browser) {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e?.stack ?? e)));
  page.on("console", (m) => m.type() === "error" && errors.push(`${m.text()} @ ${m.location()?.url ?? ""}`));
  // generous: the frontend's first load takes minutes on a busy 2-core machine
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 240_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 240_000 });
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
      if (s.properties) node.properties = { ...(node.properties ?? {}), ...structuredClone(s.properties) };
      if (s.size) {
        const min = node.computeSize?.() ?? [0, 0];
        node.size = [Math.max(s.size[0], min[0]), Math.max(s.size[1], min[1])];
      }
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
    // Columns left to right, nodes stacked in spec order. Node sizes are their after-run sizes (spec sizes), so
    // previews and report panels never reach a neighbour; `shots` checks that after a real run.
    const cols = {};
    for (const [key, s] of Object.entries(spec.nodes)) (cols[s.col] ??= []).push(made[key]);
    let x = 40;
    for (const c of Object.keys(cols).map(Number).sort((p, q) => p - q)) {
      let y = 60;
      for (const n of cols[c]) {
        n.pos = [x, y];
        y += n.size[1] + LiteGraph.NODE_TITLE_HEIGHT + 24;
      }
      x += Math.max(...cols[c].map((n) => n.size[0])) + 40;
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

/** In the page: fit the whole graph into the canvas. */
async function fitView(page) {
  await page.evaluate(() => {
    const { app, LiteGraph } = window;
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
  });
}

/** Node rectangles [id, type, x, y, w, h] (title bar included) and the pairs that overlap. */
async function rects(page) {
  return page.evaluate(() => {
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
}

/** In the page: show the first node of a type at 130 % in the top left corner (for a readable close-up). */
async function zoomTo(page, type) {
  const found = await page.evaluate((type) => {
    const { app, LiteGraph } = window;
    const n = app.graph.nodes.find((x) => x.type === type);
    if (!n) return false;
    app.canvas.ds.scale = 1.3;
    app.canvas.ds.offset = [30 / 1.3 - n.pos[0], (30 + LiteGraph.NODE_TITLE_HEIGHT * 1.3) / 1.3 - n.pos[1]];
    app.graph.setDirtyCanvas(true, true);
    return true;
  }, type);
  if (found) await page.waitForTimeout(500);
  return found;
}

/** In the page: load a workflow, queue it, wait for the run to end; then the editor's state after the run. */
async function runOne(page, name, workflow, shot, timeoutMs, spec) {
  await page.evaluate(async ([name, wf]) => {
    await window.app.loadGraphData(structuredClone(wf), true, true, name);
  }, [name, workflow]);
  await page.waitForTimeout(800);
  const before = await rects(page);
  if (await zoomTo(page, "TokenFuseTokenSchedulerController")) {
    await page.screenshot({ path: shot.replace(/\.png$/, "__TokenSchedulerController_before_run.png") });
  }
  const status = await page.evaluate(async (timeoutMs) => {
    const { app } = window;
    const { api } = await import("/scripts/api.js");
    const finished = new Promise((resolve) => {
      api.addEventListener("execution_success", () => resolve({ ok: true }), { once: true });
      api.addEventListener("execution_error", (e) => resolve({ ok: false, error: e.detail?.exception_message ?? "error" }), { once: true });
    });
    try {
      const p = await app.graphToPrompt();
      for (const node of Object.values(p.output)) {
        if (node.class_type === "TokenFuseScheduledFusion") Object.assign(node.inputs, { steps: 2, guide_size: 64, max_size: 64 });
        if (node.class_type === "TokenFuseFaceDetect") node.inputs.crop_size = 128;
        if (node.class_type === "TokenFuseVideoFaceFusion") Object.assign(node.inputs, { steps: 2, guide_size: 64, crf: 23, preset: "ultrafast" });
      }
      await api.queuePrompt(0, p);
    } catch (err) {
      return { ok: false, error: `not queued: ${JSON.stringify(err?.response ?? String(err)).slice(0, 2000)}` };
    }
    const timeout = new Promise((r) => setTimeout(() => r({ ok: false, error: `no result in ${timeoutMs} ms` }), timeoutMs));
    return Promise.race([finished, timeout]);
  }, timeoutMs);
  await page.waitForTimeout(2500); // previews load, nodes resize
  const after = await rects(page);
  const outputs = await page.evaluate(() => {
    const { app } = window;
    const out = {};
    for (const n of app.graph.nodes) {
      const o = app.nodeOutputs?.[String(n.id)];
      out[`${n.id}:${n.type}`] = { text: o?.text ?? null, images: o?.images?.length ?? 0, imgs: n.imgs?.length ?? 0 };
    }
    return out;
  });
  await fitView(page);
  await page.waitForTimeout(700);
  await page.screenshot({ path: shot });
  // Close-ups of the nodes that draw their own panels, at 130 % (text readable in the screenshot).
  for (const type of ["TokenFuseTokenSchedulerController", "TokenFuseScheduledFusion", "TokenFusePatchTokenize", "TokenFuseBlend",
    "TokenFuseFaceTrack", "TokenFuseVideoFaceFusion"]) {
    if (await zoomTo(page, type)) await page.screenshot({ path: shot.replace(/\.png$/, `__${type.replace("TokenFuse", "")}.png`) });
  }
  await fitView(page);
  const card = spec?.card ? await resultCard(page, spec.card, shot.replace(/\.png$/, ".card.jpg")) : null;
  return { status, before, after, outputs, card };
}

/**
 * The template browser's card picture, from what the run showed: the photo with the detected faces and PatchTokenize's
 * token plan with its saving, under the card's title (the browser shows web/lib/templates.js's title and description
 * below it).
 * Square: the template browser crops thumbnails to a square.
 */
async function resultCard(page, card, file) {
  const b64 = await page.evaluate(async ([card, size]) => {
    const { app } = window;
    const tracked = app.graph.nodes.find((n) => n.type === "PreviewImage" && n.title === "Tracked faces")?.imgs ?? [];
    if (tracked.length) {
      // the video workflow: FaceTrack's frames with the followed face drawn, and its crop jitter raw -> smoothed
      const trackNode = app.graph.nodes.find((n) => n.type === "TokenFuseFaceTrack");
      const jitter = /crop jitter ([\d.]+) -> ([\d.]+)/.exec(app.nodeOutputs?.[String(trackNode?.id)]?.text?.[0] ?? "");
      const c = document.createElement("canvas");
      c.width = c.height = size;
      const g = c.getContext("2d");
      g.fillStyle = "#202128";
      g.fillRect(0, 0, size, size);
      g.fillStyle = "#f2f2f2";
      g.font = "bold 40px sans-serif";
      g.fillText(card.title, 24, 58);
      g.fillStyle = "#b9c3d6";
      g.font = "23px sans-serif";
      g.fillText(card.subtitle, 24, 94);
      const top = 122, pad = 24, gap = 12, caption = 34, cols = 2, rows = 2;
      const w = (size - 2 * pad - gap * (cols - 1)) / cols, h = (size - top - pad - caption - gap * (rows - 1)) / rows;
      const shown = [0, 2, 3, 5].map((i) => tracked[Math.min(i, tracked.length - 1)]);
      shown.forEach((img, k) => {
        const x = pad + (k % cols) * (w + gap), y = top + Math.floor(k / cols) * (h + gap);
        const s = Math.min(w / img.naturalWidth, h / img.naturalHeight);
        const dw = img.naturalWidth * s, dh = img.naturalHeight * s;
        g.drawImage(img, x + (w - dw) / 2, y + (h - dh) / 2, dw, dh);
      });
      g.fillStyle = "#d8d8d8";
      g.font = "20px sans-serif";
      g.fillText(jitter ? `face tracked · crop jitter ${jitter[1]} -> ${jitter[2]} px/frame²` : "face tracked", pad, size - pad);
      return c.toDataURL("image/jpeg", 0.86).split(",")[1];
    }
    const faces = app.graph.nodes.find((n) => n.type === "PreviewImage" && n.title === "Detected faces")?.imgs?.[0];
    const planNode = app.graph.nodes.find((n) => n.type === "TokenFusePatchTokenize");
    const plan = planNode?.imgs?.[0];
    if (!faces || !plan) return null;
    const saving = /(\d+) % fewer tokens/.exec(app.nodeOutputs?.[String(planNode.id)]?.text?.[0] ?? "")?.[1];
    const c = document.createElement("canvas");
    c.width = c.height = size;
    const g = c.getContext("2d");
    g.fillStyle = "#202128";
    g.fillRect(0, 0, size, size);
    g.fillStyle = "#f2f2f2";
    g.font = "bold 40px sans-serif";
    g.fillText(card.title, 24, 58);
    g.fillStyle = "#b9c3d6";
    g.font = "23px sans-serif";
    g.fillText(card.subtitle, 24, 94);
    const top = 122, pad = 24, gap = 16, caption = 30;
    // two panels side by side, or stacked when the photo is wide (a group photo)
    const wide = faces.naturalWidth > 1.4 * faces.naturalHeight;
    const w = wide ? size - 2 * pad : (size - 2 * pad - gap) / 2;
    const h = wide ? (size - top - pad - gap - 2 * caption) / 2 : size - top - pad - caption;
    const panel = (img, x, y, label) => {
      const s = Math.min(w / img.naturalWidth, h / img.naturalHeight);
      const dw = img.naturalWidth * s, dh = img.naturalHeight * s;
      g.drawImage(img, x + (w - dw) / 2, y + (h - dh) / 2, dw, dh);
      g.fillStyle = "#d8d8d8";
      g.font = "20px sans-serif";
      g.fillText(label, x + (w - dw) / 2, y + (h + dh) / 2 + 24);
    };
    const planLabel = saving ? `token plan: ${saving} % fewer tokens` : "token plan";
    if (wide) {
      panel(faces, pad, top, card.faces);
      panel(plan, pad, top + h + caption + gap, planLabel);
    } else {
      panel(faces, pad, top, card.faces);
      panel(plan, pad + w + gap, top, saving ? `plan: ${saving} % fewer` : "token plan");
    }
    return c.toDataURL("image/jpeg", 0.86).split(",")[1];
  }, [card, 512]);
  if (b64) writeFileSync(file, Buffer.from(b64, "base64"));
  return b64 ? file : null;
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
    const { api } = await import("/scripts/api.js");
    const browserOrder = await api.getWorkflowTemplates(); // what the template browser gets (web/tokenfuse_templates.js)
    return { missing, loaded, changed, links: saved.links.length, prompt: prompt.output, templates, browserOrder };
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
      console.error(`wrote ${spec.name}.json (${graph.nodes.length} nodes, ${graph.links.length} links)`);
    }
    console.log(JSON.stringify({ made: WORKFLOWS.map((s) => s.name), errors }));
  } else if (mode === "shots") {
    const results = {};
    for (const f of jsonFiles(dir)) {
      const name = f.replace(/\.json$/, "");
      const spec = WORKFLOWS.find((w) => w.name === name);
      results[f] = await runOne(page, f, JSON.parse(readFileSync(path.join(dir, f), "utf8")), path.join(outDir, `${name}.png`), 540_000, spec);
      console.error(`ran ${f}: ${JSON.stringify(results[f].status)}, ${results[f].after.overlaps.length} overlap(s)`);
    }
    console.log(JSON.stringify({ results, errors }));
  } else {
    const results = {};
    for (const f of jsonFiles(dir)) {
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
