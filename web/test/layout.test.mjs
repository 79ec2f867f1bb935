import { test } from "node:test";
import assert from "node:assert/strict";
import { columnBars, rowBars, windowSpan, levelColor, previewRoom } from "../lib/layout.js";
import { viewRoutes } from "../lib/preview.js";

const RECT = { x: 10, y: 20, w: 100, h: 50 };

test("column bars fill the width and stand on the bottom edge", () => {
  const bars = columnBars([0, 0.5, 1], RECT, { gap: 5, maxValue: 1 });
  assert.equal(bars.length, 3);
  assert.equal(bars[0].x, 10);
  assert.ok(Math.abs(bars[2].x + bars[2].w - 110) < 1e-9);
  assert.equal(bars[0].h, 0);
  assert.equal(bars[1].h, 25);
  assert.equal(bars[2].y, 20);
  for (const b of bars) assert.equal(b.y + b.h, 70);
});

test("column bars clamp values and survive empty input", () => {
  assert.deepEqual(columnBars([], RECT), []);
  const [b] = columnBars([5], RECT, { maxValue: 1 });
  assert.equal(b.h, 50);
  const [n] = columnBars([NaN], RECT, { maxValue: 1 });
  assert.equal(n.h, 0);
  assert.deepEqual(columnBars([1], { ...RECT, w: 0 }), []);
});

test("row bars stack from the top with the filled part proportional", () => {
  const rows = rowBars([1, 0.25], RECT, { gap: 2, maxRowH: 10 });
  assert.equal(rows[0].track.y, 20);
  assert.equal(rows[1].track.y, 32);
  assert.equal(rows[0].fill.w, 100);
  assert.equal(rows[1].fill.w, 25);
});

test("window span covers start..end of the rect", () => {
  assert.deepEqual(windowSpan(0.2, 0.6, RECT), { x: 30, y: 20, w: 40, h: 50 });
  assert.equal(windowSpan(0.8, 0.2, RECT).w, 0);
});

test("level colours are stable and fall back to grey", () => {
  assert.equal(levelColor(8), "#4fa3e0");
  assert.equal(levelColor(128), "#999999");
});

test("preview routes carry filename, subfolder and type", () => {
  const r = viewRoutes([{ filename: "a b.png", subfolder: "", type: "temp" }, { filename: "" }, null], 7);
  assert.deepEqual(r, ["/view?filename=a+b.png&subfolder=&type=temp&rand=7"]);
  assert.deepEqual(viewRoutes(undefined), []);
});

test("PatchTokenize's preview room is reserved once, never shrinks a node, never grows one that has it", () => {
  assert.deepEqual(previewRoom([273, 286], [273, 286], 220, 260), [273, 506]); // a new node: widgets + preview
  assert.equal(previewRoom([273, 506], [273, 286], 220, 260), null); // already there
  assert.equal(previewRoom([340, 640], [273, 506], 0, 260), null); // the frontend's preview widget counted
  assert.deepEqual(previewRoom([200, 600], [180, 286], 220, 260), [260, 600]); // only the width was missing
  assert.deepEqual(previewRoom(undefined, undefined, 220, 260), [260, 220]);
});
