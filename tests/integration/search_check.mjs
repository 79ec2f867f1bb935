// Type queries into the real ComfyUI node search box (double-click on the canvas) and print the results.
//
// usage: node tests/integration/search_check.mjs <comfyui base url> <query> [<query> ...]
// env:   PLAYWRIGHT_CORE_DIR, CHROMIUM (as tests/integration/browser_check.mjs)
// Prints one JSON object: {query: [result text, ...]} (first 8 results, in the order the search box shows them).

import { createRequire } from "node:module";
import path from "node:path";

const [base, ...queries] = process.argv.slice(2);
if (!base || !queries.length) {
  console.error("usage: search_check.mjs <base url> <query> [<query> ...]");
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
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 90_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 90_000 });
  await page.waitForTimeout(1500);
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
  await page.evaluate(() => window.app.graph.clear());
  for (const q of queries) {
    // a double-click on the empty canvas opens the node search box; on a loaded machine the frontend can miss the
    // first one (seen once with two benches running beside it), so try again before giving up
    let opened = false;
    for (let attempt = 0; attempt < 3 && !opened; attempt++) {
      await page.mouse.dblclick(800, 600);
      opened = await page
        .waitForFunction(() => document.activeElement?.tagName === "INPUT", null, { timeout: 20_000 })
        .then(
          () => true,
          () => false,
        );
    }
    if (!opened) throw new Error(`the node search box did not open for ${JSON.stringify(q)} (3 double-clicks)`);
    await page.keyboard.type(q, { delay: 20 });
    // results arrive after a debounce; on a busy machine that can take seconds
    await page
      .waitForFunction(() => document.querySelectorAll("[role=option]").length > 0, null, { timeout: 30_000 })
      .catch(() => {});
    await page.waitForTimeout(1000);
    out[q] = await page.evaluate(() =>
      [...document.querySelectorAll("[role=option]")]
        .map((e) => e.innerText.replace(/\s+/g, " ").trim())
        .filter(Boolean)
        .slice(0, 8),
    );
    await page.keyboard.press("Escape");
    await page.waitForTimeout(300);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
