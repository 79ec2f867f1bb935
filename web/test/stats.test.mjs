import { test } from "node:test";
import assert from "node:assert/strict";
import {
  normalizeStats, matchEventToNodes, mergeStats, formatTokens, formatSeconds, formatMemMb, levelLabel, statsLines, keptFraction, removedFraction, StatsBook,
} from "../lib/stats.js";

const EVENT = {
  node: "12", step: 3, steps: 20, step_time_s: 0.41, peak_mem_mb: 3120.5,
  levels: [{ level: 16, tokens_in: 1024, tokens_out: 700 }, { level: 8, tokens_in: 4096, tokens_out: 2458 }],
  final: false, summary: null,
};

test("normalizeStats keeps a valid payload and sorts levels", () => {
  const s = normalizeStats(EVENT);
  assert.equal(s.node, "12");
  assert.equal(s.step, 3);
  assert.deepEqual(s.levels.map((l) => l.level), [8, 16]);
  assert.equal(s.levels[0].tokensOut, 2458);
  assert.equal(s.peakMemMb, 3120.5);
});

test("normalizeStats rejects junk and skips bad levels", () => {
  assert.equal(normalizeStats(null), null);
  assert.equal(normalizeStats({ step: 1 }), null);
  assert.equal(normalizeStats({ step: 1, steps: 0 }), null);
  const s = normalizeStats({ node: 7, step: 25, steps: 20, peak_mem_mb: null, levels: [{ level: 8 }, null, "x"] });
  assert.equal(s.node, "7");
  assert.equal(s.step, 20);
  assert.equal(s.peakMemMb, null);
  assert.deepEqual(s.levels, []);
});

test("events match nodes by id, subgraph path or broadcast", () => {
  const nodes = [{ id: 12, inRoot: true }, { id: 3, inRoot: true }, { id: 12, inRoot: false }];
  assert.deepEqual(matchEventToNodes("12", nodes), [0]);
  assert.deepEqual(matchEventToNodes("5:12", nodes), [2]);
  assert.deepEqual(matchEventToNodes(null, nodes), [0, 1, 2]);
  assert.deepEqual(matchEventToNodes("99", nodes), []);
  assert.deepEqual(matchEventToNodes("12", undefined), []);
});

test("formatting helpers", () => {
  assert.equal(formatTokens(950), "950");
  assert.equal(formatTokens(4096), "4.1k");
  assert.equal(formatTokens(65536), "66k");
  assert.equal(formatTokens(1_200_000), "1.2M");
  assert.equal(formatTokens(undefined), "?");
  assert.equal(formatSeconds(0.038), "38 ms");
  assert.equal(formatSeconds(1.5), "1.50 s");
  assert.equal(formatSeconds(null), "—");
  assert.equal(formatMemMb(512), "512 MiB");
  assert.equal(formatMemMb(3120.5), "3.05 GiB");
  assert.equal(formatMemMb(null), "—");
});

test("level label and removed fraction use the chart's unit", () => {
  const l = { level: 8, tokensIn: 4096, tokensOut: 2458 };
  assert.equal(levelLabel(l), "/8  4.1k → 2.5k tokens, −40 % removed"); // one unit: removed, as on the bars
  assert.equal(levelLabel({ level: 0, tokensIn: 4096, tokensOut: 2048 }), "DiT  4.1k → 2.0k K/V tokens, −50 % removed");
  assert.equal(keptFraction({ level: 8, tokensIn: 0, tokensOut: 0 }), 1);
  assert.equal(removedFraction({ level: 8, tokensIn: 0, tokensOut: 0 }), 0);
  assert.ok(Math.abs(removedFraction(l) - 0.3999) < 1e-3);
});

test("statsLines shows progress while running and the summary at the end", () => {
  assert.deepEqual(statsLines(null), []);
  assert.deepEqual(statsLines(normalizeStats(EVENT)), ["step 3/20 · 410 ms/step · peak 3.05 GiB"]);
  const fin = normalizeStats({ ...EVENT, step: 20, final: true, summary: "tokens -38%, 1.21x" });
  assert.deepEqual(statsLines(fin), ["done 20 steps · 410 ms/step · peak 3.05 GiB", "tokens -38%, 1.21x"]);
});

test("on CPU the peak is the process peak RSS, named so (it showed 'peak —' for the whole run)", () => {
  const cpu = normalizeStats({ ...EVENT, peak_mem_mb: 950.4, peak_mem_kind: "rss" });
  assert.deepEqual(statsLines(cpu), ["step 3/20 · 410 ms/step · peak RSS 950 MiB"]);
  assert.equal(normalizeStats({ ...EVENT, peak_mem_kind: "bogus" }).peakMemKind, null);
  const fin = normalizeStats({ ...EVENT, step: 20, peak_mem_mb: null, peak_mem_kind: null, final: true });
  assert.match(statsLines(mergeStats(cpu, fin))[0], /peak RSS 950 MiB$/); // the kind stays with the kept number
});

test("the final event keeps step time, memory and levels of the run's last step", () => {
  const last = normalizeStats(EVENT);
  const fin = normalizeStats({ node: "12", step: 3, steps: 20, step_time_s: null, peak_mem_mb: null, levels: [],
    final: true, summary: "done" });
  const m = mergeStats(last, fin);
  assert.equal(m.final, true);
  assert.equal(m.summary, "done");
  assert.equal(m.stepTimeS, 0.41);
  assert.equal(m.peakMemMb, 3120.5);
  assert.equal(m.levels.length, 2);
  const nextRun = normalizeStats({ ...EVENT, step: 1, levels: [] });
  assert.deepEqual(mergeStats(m, nextRun).levels, []); // a new run starts clean
  assert.equal(mergeStats(null, fin), fin);
  assert.equal(mergeStats(last, null), last);
});

test("each workflow tab keeps its own live stats (one websocket, one client id for all tabs)", () => {
  const book = new StatsBook();
  const tabA = { path: "a.json" };
  const tabB = { path: "b.json" };
  book.prompts.queued(tabA)("prompt-a"); // tab A queued its workflow, then the user opened tab B
  book.start("prompt-a", tabB);
  book.add(normalizeStats({ ...EVENT, prompt_id: "prompt-a" }), tabB);
  assert.equal(book.get(tabB, 12), null, "tab B's node 12 shows nothing of tab A's run");
  assert.equal(book.get(tabA, 12).step, 3, "tab A's node 12 has its numbers when the user comes back");
  // tab B runs: its start clears only its own numbers
  book.prompts.queued(tabB)("prompt-b");
  book.start("prompt-b", tabA);
  book.add(normalizeStats({ ...EVENT, step: 1, prompt_id: "prompt-b" }), tabA);
  assert.equal(book.get(tabA, 12).step, 3);
  assert.equal(book.get(tabB, 12).step, 1);
});

test("a run that starts before its queue answer, or that this page did not queue", () => {
  const book = new StatsBook();
  const tabA = { path: "a.json" };
  const tabB = { path: "b.json" };
  const answered = book.prompts.queued(tabA);
  book.start("p1", tabB); // execution_start can beat the /prompt answer
  book.add(normalizeStats({ ...EVENT, prompt_id: "p1" }), tabB);
  answered("p1");
  assert.equal(book.get(tabA, 12).step, 3);
  assert.equal(book.get(tabB, 12), null);
  // an unknown prompt (another client, a page reload) goes to the open tab, and stays there
  book.add(normalizeStats({ ...EVENT, step: 5, prompt_id: "p9" }), tabB);
  book.add(normalizeStats({ ...EVENT, step: 6, prompt_id: "p9" }), tabA);
  assert.equal(book.get(tabB, 12).step, 6);
  // no prompt id (an older server): the open tab
  book.add(normalizeStats({ ...EVENT, step: 7 }), tabA);
  assert.equal(book.get(tabA, 12).step, 7);
});

test("stats by node id, subgraph path and broadcast", () => {
  const book = new StatsBook();
  const wf = "w";
  book.add(normalizeStats({ ...EVENT, node: "5:12", prompt_id: "p" }), wf);
  assert.equal(book.get(wf, 12, true), null, "root node 12 is not the subgraph's node 12");
  assert.equal(book.get(wf, 12, false).node, "5:12");
  book.add(normalizeStats({ ...EVENT, node: null, step: 2, prompt_id: "p" }), wf);
  assert.equal(book.get(wf, 3, true).step, 2, "an event for every node");
  // the final event keeps the step's level counts (mergeStats), per node
  book.add(normalizeStats({ ...EVENT, node: "5:12", step: 20, steps: 20, levels: [], final: true, summary: "done", prompt_id: "p" }), wf);
  assert.equal(book.get(wf, 12, false).levels.length, 2);
});

test("a run cancelled, failed or cut off by a server restart is not shown as done", () => {
  const final = normalizeStats({ ...EVENT, step: 7, steps: 20, final: true, summary: "TokenFuse: 7 steps" });
  assert.equal(statsLines(final)[0].split(" · ")[0], "stopped at step 7/20"); // it said "done 20 steps"
  const done = normalizeStats({ ...EVENT, step: 20, steps: 20, final: true, summary: "s" });
  assert.equal(statsLines(done)[0].split(" · ")[0], "done 20 steps");
  const book = new StatsBook();
  book.add(normalizeStats({ ...EVENT, prompt_id: "p" }), "tab");
  book.add(normalizeStats({ ...EVENT, node: "3", step: 20, steps: 20, final: true, prompt_id: "p" }), "tab");
  book.stopRunning("server connection lost");
  assert.equal(statsLines(book.get("tab", 12))[0].split(" · ")[0], "stopped at step 3/20 (server connection lost)");
  assert.equal(statsLines(book.get("tab", 3))[0].split(" · ")[0], "done 20 steps");
  book.add(normalizeStats({ ...EVENT, step: 4, prompt_id: "p" }), "tab"); // the run goes on after a reconnect
  assert.equal(statsLines(book.get("tab", 12))[0].split(" · ")[0], "step 4/20");
});

test("the final event's status decides, where the server sends it", () => {
  // a sampler without a per-step callback (dpm_adaptive) matches its last step from the nearest sigma: short of the
  // steps on a run that completed; and a failed run says failed
  const lines = (extra) => statsLines(normalizeStats({ ...EVENT, step: 17, steps: 20, final: true, summary: "s", ...extra }));
  assert.equal(lines({ status: "complete" })[0].split(" · ")[0], "done 20 steps");
  assert.equal(lines({ status: "cancelled" })[0].split(" · ")[0], "stopped at step 17/20");
  assert.equal(lines({ status: "failed" })[0].split(" · ")[0], "failed at step 17/20");
  assert.equal(lines({ status: "bogus" })[0].split(" · ")[0], "stopped at step 17/20"); // unknown: as older packs
});

test("a run without the node keeps the summary of the last run that had it, marked as the previous run", () => {
  const book = new StatsBook();
  const tab = { path: "a.json" };
  book.prompts.queued(tab)("p1");
  book.start("p1", tab);
  book.add(normalizeStats({ ...EVENT, prompt_id: "p1" }), tab);
  book.add(normalizeStats({ ...EVENT, step: 20, steps: 20, levels: [], final: true, status: "complete", summary: "TokenFuse: p1", prompt_id: "p1" }), tab);
  // the same tab queues a run with no TokenSchedulerController in it (bypassed, deleted, another workflow loaded)
  book.prompts.queued(tab)("p2");
  book.start("p2", tab);
  const kept = book.get(tab, 12);
  assert.equal(kept?.summary, "TokenFuse: p1", "the start of a run without the node cleared its report");
  assert.deepEqual(statsLines(kept), ["previous run: done 20 steps · 410 ms/step · peak 3.05 GiB", "TokenFuse: p1"]);
  // a run that has the node replaces its numbers with its own, nothing carried over from p1
  book.start("p3", tab);
  book.add(normalizeStats({ ...EVENT, step: 3, levels: [], prompt_id: "p3", step_time_s: null }), tab);
  assert.equal(book.get(tab, 12).summary, null);
  assert.deepEqual(book.get(tab, 12).levels, [], "levels of another run are not merged in");
  assert.equal(statsLines(book.get(tab, 12))[0], "step 3/20 · —/step · peak 3.05 GiB");
  // an event for every node (no node id) is not hidden by a node's own numbers from an earlier run
  book.start("p4", tab);
  book.add(normalizeStats({ ...EVENT, node: null, step: 2, prompt_id: "p4" }), tab);
  assert.equal(book.get(tab, 12).step, 2);
});

test("live stats of closed workflow tabs are dropped, and a long session stays bounded", () => {
  const book = new StatsBook(undefined, 4);
  const tabs = Array.from({ length: 40 }, (_, i) => ({ path: `w${i}.json` }));
  tabs.forEach((tab, i) => {
    book.prompts.queued(tab)(`p${i}`);
    book.start(`p${i}`, tab);
    book.add(normalizeStats({ ...EVENT, prompt_id: `p${i}` }), tab);
  });
  assert.equal(book.byWorkflow.size, 4, "every tab of the session was kept");
  assert.equal(book.get(tabs[39], 12).step, 3, "the most recent tab keeps its numbers");
  book.start("p38", tabs[38]); // a tab in use again is not the first to go
  book.add(normalizeStats({ ...EVENT, prompt_id: "p-new" }), { path: "new.json" });
  assert.notEqual(book.get(tabs[38], 12), null);
  assert.equal(book.get(tabs[36], 12), null);
  // closing tabs drops their numbers at once
  const open = new Set([tabs[39]]);
  book.retain((w) => open.has(w));
  assert.deepEqual([...book.byWorkflow.keys()], [tabs[39]]);
});
