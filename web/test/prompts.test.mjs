import { test } from "node:test";
import assert from "node:assert/strict";
import { forgetClosed, isOpenWorkflowOf, PromptWorkflows, touch, wrapQueuePrompt, WORKFLOWS_KEPT } from "../lib/prompts.js";

test("queuePrompt is wrapped once and files each prompt under the tab open when it was queued", async () => {
  let open = "tab A";
  let n = 0;
  const api = {
    async queuePrompt() {
      open = "tab B"; // the user switches tabs while the request is under way
      return { prompt_id: `p${++n}` };
    },
  };
  const tracker = new PromptWorkflows();
  assert.equal(wrapQueuePrompt(api, () => open, tracker), true);
  const wrapped = api.queuePrompt;
  assert.equal(wrapQueuePrompt(api, () => open, tracker), true);
  assert.equal(api.queuePrompt, wrapped, "wrapped once (both extensions ask)");
  assert.deepEqual(await api.queuePrompt(0, {}), { prompt_id: "p1" });
  assert.equal(tracker.workflowOf("p1", "tab B"), "tab A");
  assert.equal(tracker.start("p1", "tab B"), "tab A");
  assert.equal(tracker.runningWorkflow("tab B"), "tab A");
  assert.equal(wrapQueuePrompt({}, () => open, tracker), false);
});

test("a refused queue request leaves nothing pending", async () => {
  const api = { async queuePrompt() { throw new Error("400"); } };
  const tracker = new PromptWorkflows();
  wrapQueuePrompt(api, () => "tab A", tracker);
  await assert.rejects(api.queuePrompt(0, {}));
  assert.deepEqual(tracker.pending, []);
  assert.equal(tracker.workflowOf("other", "tab B"), "tab B");
});

test("per-tab state: closed tabs are forgotten, the least recently used beyond the bound too", () => {
  const map = new Map([["a", 1], ["b", 2], ["c", 3]]);
  assert.deepEqual([...forgetClosed(map, (k) => k !== "b").keys()], ["a", "c"]);
  touch(map, "a");
  assert.deepEqual([...forgetClosed(map, () => true, 1).keys()], ["a"], "the most recently used is kept");
  // the frontend's workflow store says which tabs are open (by path); no store, or the one key without tabs: kept
  const wa = { path: "a.json" };
  const app = { extensionManager: { workflow: { isOpen: (w) => w.path === "b.json" } } };
  assert.equal(isOpenWorkflowOf(app, wa, "none"), false);
  assert.equal(isOpenWorkflowOf(app, "none", "none"), true);
  assert.equal(isOpenWorkflowOf({}, wa, "none"), true);
  assert.equal(isOpenWorkflowOf({ extensionManager: { workflow: { isOpen: () => { throw new Error("x"); } } } }, wa, "none"), true);
  assert.ok(WORKFLOWS_KEPT >= 8);
});
