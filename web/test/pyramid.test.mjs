import { test } from "node:test";
import assert from "node:assert/strict";
import {
  BLOCK_LEVELS, chartFamily, presetSchedule, pyramidSeries, ratioFor, resolveSchedule, SCHEDULE_DEFAULTS,
} from "../lib/pyramid.js";

const RAMP = { protectBlocks: 2, rampStart: 3, rampStep: 0.05, rampEvery: 2, rampCap: 0.3 };

test("protected blocks keep every token; before rampStart the base ratio applies", () => {
  assert.deepEqual([0, 1, 2].map((i) => ratioFor(0.1, i, RAMP)), [0, 0, 0.1]);
});

test("ramp adds rampStep every rampEvery indices from rampStart, capped at rampCap", () => {
  const r = [3, 4, 5, 6, 7, 8, 9, 10].map((i) => ratioFor(0.1, i, RAMP));
  assert.deepEqual(r, [0.15, 0.15, 0.2, 0.2, 0.25, 0.25, 0.3, 0.3]);
});

test("the ramp never lowers a base above the cap, and never exceeds 0.9", () => {
  assert.equal(ratioFor(0.6, 9, RAMP), 0.6);
  assert.equal(ratioFor(0.89, 15, { ...RAMP, rampStep: 0.5, rampCap: 0.9 }), 0.9);
});

test("zero base or zero step means no reduction / no ramp", () => {
  assert.equal(ratioFor(0, 9, RAMP), 0);
  assert.equal(ratioFor(0.4, 9, { ...RAMP, rampStep: 0 }), 0.4);
});

test("missing ramp fields fall back to the Schedule defaults", () => {
  assert.equal(ratioFor(0.5, 1, {}), 0); // protect_blocks default 2
  assert.equal(ratioFor(0.5, 5, {}), 0.5); // ramp_step default 0
  assert.equal(SCHEDULE_DEFAULTS.rampEvery, 2);
});

test("presets mirror preset_schedule for SD1.5 and SDXL", () => {
  assert.deepEqual(presetSchedule("balanced", "sd15").ratios, { 8: 0.75, 16: 0.75 });
  assert.deepEqual(presetSchedule("balanced", "sdxl").ratios, { 16: 0.75, 32: 0.5 });
  const low4 = presetSchedule("lowvram_4gb", "sd15");
  assert.deepEqual(low4.ratios, { 8: 0.89, 16: 0.89, 32: 0.75, 64: 0.5 });
  assert.equal(low4.protectBlocks, 0);
  assert.equal(low4.rampCap, 0.89);
  assert.deepEqual(presetSchedule("lowvram_8gb", "sdxl").ratios, { 16: 0.8, 32: 0.75 });
  assert.equal(presetSchedule("lowvram_6gb", "dit").ditRatio, 0.65);
  assert.equal(presetSchedule("nope"), null);
  assert.deepEqual(presetSchedule("off").ratios, {});
});

test("resolveSchedule mirrors schedule_from_widgets: preset, then strategy, then ratio", () => {
  const b = resolveSchedule({ preset: "balanced", strategy: "preset", ratio: 0 });
  assert.deepEqual(b.ratios, { 8: 0.75, 16: 0.75 });
  assert.equal(b.strategy, "todo");
  const r = resolveSchedule({ preset: "balanced", strategy: "tome", ratio: 0.3 });
  assert.deepEqual(r.ratios, { 8: 0.3, 16: 0.3 });
  assert.equal(r.strategy, "tome");
  assert.deepEqual(resolveSchedule({ preset: "off", ratio: 0.5 }).ratios, {}); // off stays identity
  assert.equal(resolveSchedule({ preset: "nope" }).preset, "off");
  assert.equal(resolveSchedule(undefined).preset, "off");
  assert.equal(resolveSchedule({ preset: "balanced", ratio: "x" }).ratios[8], 0.75);
});

test("schedule_text JSON overrides fields; bad text is reported and ignored", () => {
  const t = resolveSchedule({
    preset: "balanced", schedule_text: '{"ratios": {"8": 0.5}, "protect_blocks": 3, "end_percent": 0.6}',
  });
  assert.deepEqual(t.ratios, { 8: 0.5 });
  assert.equal(t.protectBlocks, 3);
  assert.equal(t.endPercent, 0.6);
  assert.equal(t.textError, null);
  const yaml = resolveSchedule({ preset: "balanced", schedule_text: "ratios: {8: 0.5}" });
  assert.match(yaml.textError, /not JSON/);
  assert.deepEqual(yaml.ratios, { 8: 0.75, 16: 0.75 });
  assert.match(resolveSchedule({ schedule_text: '{"bogus": 1}' }).textError, /unknown/);
  assert.match(resolveSchedule({ schedule_text: '{"ratios": {"7": 0.1}}' }).textError, /'ratios' keys must be level factors \(8, 16, 32, 64\), got '7'/);
  assert.match(resolveSchedule({ schedule_text: "[1]" }).textError, /mapping/);
});

test("series has one bar per transformer index with its level", () => {
  const s = pyramidSeries(resolveSchedule({ preset: "lowvram_8gb", ratio: 0.4, schedule_text: '{"protect_blocks": 2}' }));
  assert.equal(s.length, 16);
  assert.deepEqual(s.slice(0, 4).map((b) => b.ratio), [0, 0, 0.4, 0.45]); // ramp +0.05 from index 3

  assert.equal(s[6].level, 64);
  const xl = pyramidSeries(presetSchedule("balanced", "sdxl"), "sdxl");
  assert.equal(xl.length, BLOCK_LEVELS.sdxl.length);
  assert.deepEqual([...new Set(xl.map((b) => b.ratio))].sort(), [0.5, 0.75]);
});

test("chart family: widget, then the levels the last run reported, then SD1.5", () => {
  assert.equal(chartFamily("sdxl", undefined), "sdxl");
  assert.equal(chartFamily(undefined, [{ level: 16 }, { level: 32 }]), "sdxl");
  assert.equal(chartFamily(undefined, [{ level: 8 }, { level: 16 }]), "sd15");
  assert.equal(chartFamily(undefined, []), "sd15");
  assert.equal(chartFamily("dit", null), "dit");
  assert.equal(chartFamily(undefined, [{ level: 0 }]), "dit", "a DiT run reports its one level as 0");
});

test("DiT: one bar, the preset's dit_ratio (never an SD1.5 pyramid of zeros)", () => {
  for (const [preset, ratio] of [["off", 0], ["balanced", 0.5], ["lowvram_8gb", 0.6], ["lowvram_6gb", 0.65], ["lowvram_4gb", 0.75]]) {
    const s = presetSchedule(preset, "dit");
    assert.equal(s.protectBlocks, preset === "off" ? 2 : 0, preset); // preset_schedule(..., "dit")
    assert.deepEqual(pyramidSeries(s, "dit"), [{ index: 0, level: 0, ratio }], preset);
  }
  const widgets = resolveSchedule({ preset: "balanced", ratio: 0.3 }, "dit");
  assert.deepEqual(pyramidSeries(widgets, "dit"), [{ index: 0, level: 0, ratio: 0.3 }]);
  const text = resolveSchedule({ preset: "balanced", schedule_text: '{"dit_ratio": 0.2}' }, "dit");
  assert.deepEqual(pyramidSeries(text, "dit"), [{ index: 0, level: 0, ratio: 0.2 }]);
});

test("schedule_text widget names: the chart's header gets the values in effect", () => {
  const s = resolveSchedule({ preset: "balanced", strategy: "preset", ratio: 0, schedule_text: '{"ratio": 0.5, "preset": "lowvram_8gb"}' });
  assert.equal(s.textError, null);
  assert.equal(s.preset, "lowvram_8gb");
  assert.equal(s.widgetValues.ratio, 0.5);
  assert.deepEqual(s.ratios, { 8: 0.5, 16: 0.5, 32: 0.5 });
  const refused = resolveSchedule({ preset: "balanced", ratio: 0, schedule_text: '{"ratio": 0.5, "bogus": 1}' });
  assert.equal(refused.widgetValues, undefined);
  assert.deepEqual(refused.ratios, { 8: 0.75, 16: 0.75 });
});
