import { test } from "node:test";
import assert from "node:assert/strict";
import {
  chartHeader, DIT_LEGEND, familyFromModelName, isWarning, legendText, percentText, reportLines, strategyText, wrapText,
  chartNote, linkedWidgets,
} from "../lib/labels.js";
import { pyramidSeries, resolveSchedule } from "../lib/pyramid.js";

const mono = (s) => s.length; // 1 unit per character

test("strategies have plain names; 'preset' says whose strategy it is", () => {
  assert.equal(strategyText("preset", "todo"), "ToDo K/V pooling (the preset's)");
  assert.equal(strategyText("tome", "tome"), "ToMe token merging");
  assert.equal(strategyText("topk", "topk"), "top-K keys");
  assert.equal(strategyText("x", "other"), "other");
});

test("header: one unit (% removed), the family and where it came from, no raw 'todo' or 'strategy: preset'", () => {
  const values = { preset: "lowvram_4gb", strategy: "preset", ratio: 0 };
  const h = chartHeader(resolveSchedule(values, "sdxl"), values, "sdxl", "checkpoint");
  assert.equal(h, "% of tokens removed per block · SDXL (from the checkpoint name) · lowvram_4gb · ToDo K/V pooling (the preset's)");
  assert.doesNotMatch(h, /\btodo\b|strategy: preset|kept/);
  const off = chartHeader(resolveSchedule({ preset: "off" }), { preset: "off" }, "sd15", "default");
  assert.match(off, /SD1\.5 \(assumed\).*nothing removed/);
  const tome = { preset: "balanced", strategy: "tome", ratio: 0.3 };
  const r = chartHeader(resolveSchedule(tome, "sd15"), tome, "sd15", "run");
  assert.match(r, /from the last run\) · balanced · ToMe token merging · ratio 0\.30$/);
});

test("numbers on bars tell the 8/6/4 GB presets apart", () => {
  const numbers = (preset) => pyramidSeries(resolveSchedule({ preset }, "sd15"), "sd15").map((b) => percentText(b.ratio)).join(" ");
  const all = ["lowvram_8gb", "lowvram_6gb", "lowvram_4gb"].map(numbers);
  assert.equal(new Set(all).size, 3, all.join(" | "));
  assert.match(all[2], /^89 89 89 89 80 85 60 /); // 4 GB: /8, /16 at 89 %, the /32 blocks ramped from 75 %, /64 60 %
  assert.equal(percentText(0), "0");
  assert.equal(percentText(NaN), "0");
  assert.equal(percentText(0.755), "76");
});

test("legend explains the /8 … /64 levels in one short line", () => {
  assert.equal(legendText([8, 16, 32, 64]), "colour = U-Net level, latent = image / N (/8 finest)");
  assert.match(legendText([16, 32]), /\(\/16 finest\)$/);
  assert.equal(legendText(undefined), legendText([8, 16, 32, 64]));
  // what the chart draws after the swatches fits about 46 characters at the default node width
  assert.ok(legendText([8, 16, 32, 64]).replace(/^colour = /, "= ").length <= 46);
});

test("wrapText keeps every word, never exceeds the width, cuts only words longer than a line", () => {
  const s = "SD1.5 512x512: tokens -38% (64/80 blocks scheduled), 1.21x faster, peak 3.05 GiB";
  const lines = wrapText(s, 30, mono);
  assert.ok(lines.length >= 3);
  for (const ln of lines) assert.ok(ln.length <= 30, ln);
  assert.equal(lines.join(" "), s);
  assert.deepEqual(wrapText("abcdefghij", 4, mono), ["abcd", "efgh", "ij"]);
  assert.deepEqual(wrapText("a\nb", 10, mono), ["a", "b"]);
  assert.deepEqual(wrapText("", 10, mono), [""]);
});

test("report lines: multi-line ui.text is split, attention lines are flagged", () => {
  const report = [
    "ScheduledFusion: 2 face(s) in 1 frame(s), guide 512, steps 20, denoise 0.4, fallback auto, plan on",
    "frame 0 face 0: ok, seed 42, guide 512, tokens 4096, 1.20 s, peak n/a, fallbacks: none",
    "frame 0 face 1: passthrough, seed 43, guide 512, tokens 4096, 1.20 s, peak n/a, fallbacks: split_batch (after out of memory)",
    "2 face(s), 1 with fallbacks, 1 passed through, 2.40 s total",
  ].join("\n");
  const lines = reportLines([report]);
  assert.equal(lines.length, 4);
  assert.deepEqual(lines.map((l) => l.warn), [false, false, true, true]);
  assert.equal(reportLines(["2 face(s), 0 with fallbacks, 0 passed through, 1.0 s total"])[0].warn, false);
  assert.equal(reportLines(["WARNING: Blend: no face carries a processed crop"])[0].warn, true);
  assert.equal(reportLines(["Blend: pasted 1 face(s) into 1 frame(s)"])[0].warn, false);
  assert.deepEqual(reportLines(undefined), []);
  assert.deepEqual(reportLines("one\n\ntwo").map((l) => l.text), ["one", "two"]);
  assert.equal(isWarning("frame 0 face 0: ok, fallbacks: none | warnings: identity drop"), true);
});

test("the checkpoint name tells SDXL before any run", () => {
  for (const n of ["sd_xl_base_1.0.safetensors", "juggernautXL_v9.safetensors", "ponyDiffusionV6XL.safetensors", "SDXL/realvisxl_v4.safetensors", "sdxl_lightning_4step.safetensors"]) {
    assert.equal(familyFromModelName(n), "sdxl", n);
  }
  for (const n of ["v1-5-pruned-emaonly-fp16.safetensors", "pixlart.safetensors", "swan_v2.safetensors", "", undefined]) {
    assert.equal(familyFromModelName(n), null, String(n));
  }
  for (const n of ["flux1-dev-fp8.safetensors", "xlabs_flux.safetensors", "wan2.1_t2v_1.3B_fp16.safetensors", "qwen_image_fp8_e4m3fn.safetensors", "hunyuan_video_t2v_720p_bf16.safetensors", "ltx-video-2b-v0.9.safetensors"]) {
    assert.equal(familyFromModelName(n), "dit", n);
  }
});

test("a DiT chart says what its one bar is: K/V dropped per attention call, no U-Net levels", () => {
  const values = { preset: "balanced", strategy: "tome" };
  const h = chartHeader(resolveSchedule(values, "dit"), values, "dit", "run");
  assert.match(h, /^% of K\/V tokens dropped per attention call · DiT \(from the last run\) · balanced · top-K keys$/);
  assert.match(chartHeader(resolveSchedule({ preset: "off" }, "dit"), { preset: "off" }, "dit", "default"), /nothing removed$/);
  assert.match(DIT_LEGEND, /no U-Net levels/);
});

test("widgets fed by a link are named, and the chart says it cannot draw them", () => {
  const inputs = [
    { name: "model", type: "MODEL", link: 3 },
    { name: "ratio", widget: { name: "ratio" }, link: 7 },
    { name: "schedule_text", widget: { name: "schedule_text" }, link: null },
    { name: "preset", widget: { name: "preset" } },
  ];
  assert.deepEqual(linkedWidgets(inputs, ["preset", "strategy", "ratio", "schedule_text"]), ["ratio"]);
  assert.deepEqual(linkedWidgets(undefined, ["ratio"]), []);
  const schedule = { startPercent: 0, endPercent: 0.5, textError: null };
  assert.deepEqual(chartNote(schedule, []), { text: "active in 0%–50% of the steps (bar above)", level: "info" });
  const linked = chartNote(schedule, ["ratio", "schedule_text"]);
  assert.equal(linked.level, "warn");
  assert.match(linked.text, /from a link, not drawn: ratio, schedule_text/);
  assert.deepEqual(chartNote({ ...schedule, textError: "Schedule field 'x'" }, ["ratio"]), { text: "Schedule field 'x'", level: "error" });
});
