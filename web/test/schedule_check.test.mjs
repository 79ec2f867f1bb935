import test from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { resolveSchedule } from "../lib/pyramid.js";
import { checkScheduleText, echo, entriesInTextOrder, parseJsonLikePython, pyFloat } from "../lib/schedule_check.js";

// What a run says about each text (web/test/schedule_cases.json, shared with tests/test_web_js.py, which also checks
// that Python still says it).
const TABLE = JSON.parse(readFileSync(new URL("./schedule_cases.json", import.meta.url), "utf8"));

test("schedule_text the server refuses is refused by the chart, with the server's message", () => {
  const refused = TABLE.cases.filter((c) => c.error !== null);
  assert.ok(refused.length >= 10);
  for (const { text, error } of refused) {
    const s = resolveSchedule({ ...TABLE.widgets, schedule_text: text }, TABLE.widgets.family);
    assert.equal(s.textError, error, text);
    assert.deepEqual(s.ratios, { 8: 0.75, 16: 0.75 }, "a refused text changes nothing in the chart");
  }
});

test("schedule_text the server accepts draws the levels the server keeps (text order: the last duplicate wins)", () => {
  for (const c of TABLE.cases.filter((x) => x.error === null)) {
    const s = resolveSchedule({ ...TABLE.widgets, schedule_text: c.text }, TABLE.widgets.family);
    assert.equal(s.textError, null, c.text);
    assert.deepEqual(Object.fromEntries(Object.entries(s.ratios).map(([k, v]) => [String(k), v])), c.ratios, c.text);
  }
});

test("several bad ratios: the first in the text is named, as Python names it", () => {
  const { error } = checkScheduleText('{"ratios": {"32": 2, "8": 2}}');
  assert.match(error, /'ratios\[32\]'/);
  assert.deepEqual(entriesInTextOrder(parseJsonLikePython('{"16": 1, "8": 2, "16": 3}').data).map(([k]) => k), ["16", "8"]);
});

test("schedule_text the server accepts is drawn", () => {
  const s = resolveSchedule({ preset: "off", schedule_text: '{"ratios": {"08": 0.5, "1_6": 0.25}, "seed": 9223372036854775807, "end_percent": 1}' });
  assert.equal(s.textError, null);
  assert.deepEqual(s.ratios, { 8: 0.5, 16: 0.25 });
  assert.equal(resolveSchedule({ preset: "balanced", schedule_text: "null" }).textError, null);
  assert.equal(resolveSchedule({ preset: "balanced", schedule_text: "{}" }).textError, null);
});

test("the widgets' schedule is what the text's checks build on", () => {
  // ramp_cap 0.89 (lowvram) stays valid; start_percent 0.5 against the preset's end 1.0 is fine
  assert.equal(resolveSchedule({ preset: "lowvram_6gb", schedule_text: '{"start_percent": 0.5}' }).textError, null);
  assert.match(checkScheduleText('{"end_percent": 0.1}', { start_percent: 0.3 }).error, /must be >= start_percent \(0.3\), got 0.1/);
});

test("Python's int/float split and reprs", () => {
  const { data } = parseJsonLikePython('{"a": 1, "b": 1.0, "c": 1e2, "d": -Infinity}');
  assert.deepEqual([data.a.kind, data.b.kind, data.c.kind, data.d.kind], ["int", "float", "float", "float"]);
  assert.deepEqual([1, 0.1, 1e-5, 1.5e16, 1e15, 123.456, -0].map(pyFloat), ["1.0", "0.1", "1e-05", "1.5e+16", "1000000000000000.0", "123.456", "-0.0"]);
  assert.equal(echo("it's"), '"it\'s"');
  assert.equal(echo([1, 2, 3, 4, 5]), "[1, 2, 3, 4, ...]");
  assert.equal(echo("x".repeat(100)), `'${"x".repeat(37)}...${"x".repeat(38)}'`); // reprlib's cut, as Python prints it
  assert.equal(echo({ b: 1, a: [1, [2, [3]]] }), "{'a': [1, [...]], 'b': 1}");
});
