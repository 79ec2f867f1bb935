// Open ComfyUI's template browser in the real frontend and print what it shows for this pack's workflows.
//
// usage: node tests/integration/templates_check.mjs <comfyui base url>
// env:   PLAYWRIGHT_CORE_DIR, CHROMIUM (as tests/integration/browser_check.mjs)
// Prints one JSON object: {module, text (the dialog's text after choosing the pack's category), cards: [{title,
// description}] in the order shown, errors}.

import { createRequire } from "node:module";
import path from "node:path";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: templates_check.mjs <base url>");
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
const out = { errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  page.on("pageerror", (e) => out.errors.push(String(e?.stack ?? e)));
  page.on("console", (m) => m.type() === "error" && out.errors.push(m.text()));
  await page.goto(base, { waitUntil: "domcontentloaded", timeout: 240_000 });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 240_000 });
  await page.waitForTimeout(1500);
  for (let i = 0; i < 3; i++) await page.keyboard.press("Escape");
  out.module = await page.evaluate(async () => Object.keys(await (await fetch("/api/workflow_templates")).json())[0]);
  await page.evaluate(() => window.app.extensionManager.command.execute("Comfy.BrowseTemplates"));
  const dialog = page.locator("[role=dialog]").last();
  await dialog.waitFor({ timeout: 60_000 });
  await dialog.getByText(out.module, { exact: true }).first().click({ timeout: 60_000 });
  await page.waitForTimeout(2000);
  out.text = await dialog.innerText();
  out.cards = await dialog.evaluate((d) =>
    [...d.querySelectorAll("h3, [class*=title]")].map((e) => e.innerText.trim()).filter(Boolean),
  );
  await page.screenshot({ path: process.env.TOKENFUSE_TEMPLATES_SHOT || "/dev/null" }).catch(() => {});
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
