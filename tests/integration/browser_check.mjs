// Headless-Chromium check of the TokenFuse frontend extension against a running ComfyUI.
//
// usage: node tests/integration/browser_check.mjs <comfyui base url> <screenshot.png>
// env:   PLAYWRIGHT_CORE_DIR  folder with node_modules/playwright-core (npm install playwright-core there)
//        CHROMIUM             chromium executable (default /usr/bin/chromium)
// Prints one JSON object: extension registration, the node's widgets/size, console errors, page errors.

import { createRequire } from "node:module";
import path from "node:path";

const [base, shot] = process.argv.slice(2);
if (!base || !shot) {
  console.error("usage: browser_check.mjs <base url> <screenshot.png>");
  process.exit(2);
}
const require = createRequire(
  process.env.PLAYWRIGHT_CORE_DIR ? path.join(process.env.PLAYWRIGHT_CORE_DIR, "package.json") : import.meta.url,
);
const { chromium } = require("playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const result = { consoleErrors: [], pageErrors: [], failedRequests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("console", (m) => {
    const line = `${m.text()} @ ${m.location()?.url ?? ""}`;
    if (m.type() === "error") result.consoleErrors.push(line);
    else if (m.type() === "warning" && /tokenfuse/i.test(line)) result.consoleErrors.push(`warning: ${line}`);
  });
  page.on("pageerror", (e) => result.pageErrors.push(String(e?.stack ?? e)));
  page.on("requestfailed", (r) => result.failedRequests.push(r.url()));
  page.on("response", (r) => {
    if (r.status() >= 400 && r.url().includes("/extensions/")) result.failedRequests.push(`${r.status()} ${r.url()}`);
  });
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 90_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 90_000 });
  await page.waitForTimeout(1500);
  // First start shows a template browser over the canvas; close any dialog.
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");

  Object.assign(
    result,
    await page.evaluate(async () => {
      const { app } = window;
      const { api } = await import("/scripts/api.js");
      const out = {
        extensions: (app.extensions ?? []).map((e) => e.name).filter((n) => n.startsWith("tokenfuse")),
        types: Object.keys(window.LiteGraph.registered_node_types).filter((t) => t.startsWith("TokenFuse")),
      };
      app.graph.clear();
      let node = window.LiteGraph.createNode("TokenFuseTokenSchedulerController");
      out.nodeCreated = !!node;
      if (!node) return out;
      node.pos = [80, 80];
      app.graph.add(node);
      out.sizeAfterCreate = Array.from(node.size);
      const set = (name, value) => {
        const w = node.widgets?.find((x) => x.name === name);
        if (!w) return false;
        w.value = value;
        w.callback?.(value, app.canvas, node);
        return true;
      };
      out.widgets = (node.widgets ?? []).map((w) => w.name);
      out.changed = { preset: set("preset", "lowvram_8gb"), ratio: set("ratio", 0.5) };
      app.graph.setDirtyCanvas(true, true);
      // Save and reload the workflow: values survive, the chart widget is re-added, never saved.
      const saved = JSON.parse(JSON.stringify(app.graph.serialize()));
      await app.loadGraphData(saved);
      node = app.graph.getNodeById(node.id);
      out.reloaded = node
        ? { widgets: (node.widgets ?? []).map((w) => w.name), values: (node.widgets ?? []).map((w) => w.value) }
        : null;
      if (!node) return out;
      // A live-stats event as the Python side sends it, addressed to this node.
      api.dispatchCustomEvent("tokenfuse.stats", {
        node: String(node.id), step: 20, steps: 20, step_time_s: 0.41, peak_mem_mb: 3120.5,
        levels: [
          { level: 8, tokens_in: 4096, tokens_out: 1024 }, { level: 16, tokens_in: 1024, tokens_out: 256 },
          { level: 32, tokens_in: 256, tokens_out: 256 }, { level: 64, tokens_in: 64, tokens_out: 64 },
        ],
        final: true, summary: "TokenFuse: 61.3% tokens saved, 1.21x",
      });
      app.canvas.ds.offset = [0, 0];
      app.canvas.ds.scale = 1.4;
      app.graph.setDirtyCanvas(true, true);
      const plan = window.LiteGraph.createNode("TokenFusePatchTokenize");
      out.planNodeCreated = !!plan;
      if (plan) {
        plan.pos = [560, 80];
        app.graph.add(plan);
        // What the node's onExecuted receives when the Python side returns {"ui": {"images": [...]}}.
        const c = document.createElement("canvas");
        c.width = 96;
        c.height = 64;
        const g = c.getContext("2d");
        g.fillStyle = "#c33";
        g.fillRect(0, 0, 96, 64);
        const blob = await new Promise((r) => c.toBlob(r, "image/png"));
        const form = new FormData();
        form.append("image", blob, "tokenfuse_browser_check.png");
        form.append("type", "temp");
        form.append("overwrite", "true");
        const info = await (await api.fetchApi("/upload/image", { method: "POST", body: form })).json();
        const before = Array.from(plan.size);
        plan.onExecuted?.({ images: [{ filename: info.name, subfolder: info.subfolder ?? "", type: info.type }] });
        await new Promise((r) => setTimeout(r, 1200));
        out.planPreview = { before, after: Array.from(plan.size), imgs: plan.imgs?.length ?? 0 };
      }
      const prompt = await app.graphToPrompt();
      out.promptInputs = Object.keys(prompt?.output?.[String(node.id)]?.inputs ?? {});
      out.widgetsValues = node.serialize?.()?.widgets_values ?? null;
      return out;
    }),
  );
  await page.waitForTimeout(800);
  await page.screenshot({ path: shot });
} catch (err) {
  result.fatal = String(err?.stack ?? err);
} finally {
  await browser.close();
}
console.log(JSON.stringify(result, null, 1));
