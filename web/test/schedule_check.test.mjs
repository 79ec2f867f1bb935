import test from "node:test";
import assert from "node:assert/strict";

import { resolveSchedule } from "../lib/pyramid.js";
import { checkScheduleText, echo, parseJsonLikePython, pyFloat } from "../lib/schedule_check.js";

// What the server says for each text (scheduling/schedule.py; tests/test_web_js.py compares more cases live).
const REFUSED = {
  '{"protect_blocks": 99}': "Schedule field 'protect_blocks' must be an integer in [0, 64], got 99",
  '{"protect_blocks": 2.0}': "Schedule field 'protect_blocks' must be an integer in [0, 64], got 2.0",
  '{"ramp_step": 0.7}': "Schedule field 'ramp_step' must be a number in [0.0, 0.5], got 0.7",
  '{"strategy": "bogus"}': "Schedule field 'strategy' must be one of ('tome', 'todo', 'topk'), got 'bogus'",
  '{"pool": "max"}': "Schedule field 'pool' must be one of ('avg', 'nearest'), got 'max'",
  '{"start_percent": 0.5, "end_percent": 0.2}': "Schedule field 'end_percent' must be >= start_percent (0.5), got 0.2",
  '{"ratios": {"8": "0.5"}}': "Schedule field 'ratios[8]' must be a number in [0.0, 0.9], got '0.5'",
  '{"ratios": {"8.0": 0.5}}': "Schedule field 'ratios' keys must be level factors (8, 16, 32, 64), got '8.0'",
  '{"adaptive": NaN}': "Schedule field 'adaptive' must be a number in [0.0, 1.0], got nan",
  '{"time_calls": 1}': "Schedule field 'time_calls' must be true or false, got 1",
  '{"seed": 9223372036854775808}': "Schedule field 'seed' must be an integer in [0, 9223372036854775807], got 9223372036854775808",
};

test("schedule_text the server refuses is refused by the chart, with the server's message", () => {
  for (const [text, message] of Object.entries(REFUSED)) {
    const s = resolveSchedule({ preset: "balanced", schedule_text: text });
    assert.equal(s.textError, message, text);
    assert.deepEqual(s.ratios, { 8: 0.75, 16: 0.75 }, "a refused text changes nothing in the chart");
  }
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
