// `tokenfuse.stats` websocket events: validation, node matching and text formatting (pure).
//
// Payload (sent by the Python side with PromptServer.instance.send_sync("tokenfuse.stats", payload)):
// {
//   "node": "12" | null,          // unique id of the TokenSchedulerController that scheduled the model, or null
//   "prompt_id": "..." | null,    // ComfyUI's id of the running prompt: whose workflow tab the numbers belong to
//   "step": 3, "steps": 20,       // 1-based step just finished, total steps of the run
//   "step_time_s": 0.41,          // wall time of that step in seconds
//   "peak_mem_mb": 3120.5 | null, // peak memory so far in MiB (null when unknown)
//   "peak_mem_kind": "vram" | "rss" | null,  // what peak_mem_mb is: device memory, or the process peak RSS (CPU)
//   "levels": [{"level": 8, "tokens_in": 4096, "tokens_out": 2458}, ...],  // per U-Net level (factor vs image)
//   "final": false,               // true on the last event of a run
//   "summary": null | "..."       // one-line run summary, set on the final event
//   "status": null | "complete" | "cancelled" | "failed"   // how the run ended, set on the final event
// }

import { forgetClosed, PromptWorkflows, touch, WORKFLOWS_KEPT } from "./prompts.js";

/**
 * A clean copy of an event payload, or null when it is not a usable stats payload.
 * Unknown fields are dropped, numbers are coerced, bad level entries are skipped.
 */
export function normalizeStats(detail) {
  if (!detail || typeof detail !== "object") return null;
  const step = int(detail.step);
  const steps = int(detail.steps);
  if (step === null || steps === null || steps <= 0) return null;
  const levels = Array.isArray(detail.levels)
    ? detail.levels
        .map((l) => ({ level: int(l?.level), tokensIn: int(l?.tokens_in), tokensOut: int(l?.tokens_out) }))
        .filter((l) => l.level !== null && l.tokensIn !== null && l.tokensOut !== null && l.tokensIn >= 0)
        .sort((a, b) => a.level - b.level)
    : [];
  return {
    node: detail.node === null || detail.node === undefined ? null : String(detail.node),
    promptId: typeof detail.prompt_id === "string" && detail.prompt_id ? detail.prompt_id : null,
    step: Math.max(0, Math.min(step, steps)),
    steps,
    stepTimeS: float(detail.step_time_s),
    peakMemMb: float(detail.peak_mem_mb),
    peakMemKind: ["vram", "rss"].includes(detail.peak_mem_kind) ? detail.peak_mem_kind : null,
    levels,
    final: detail.final === true,
    summary: typeof detail.summary === "string" && detail.summary ? detail.summary : null,
    status: ["complete", "cancelled", "failed"].includes(detail.status) ? detail.status : null,
  };
}

/**
 * The stats a node shows after an event: the new event, with fields it leaves empty (the final event of a run
 * usually carries no step time or level counts) kept from the previous event of the same run (same prompt).
 */
export function mergeStats(prev, next) {
  if (!next) return prev ?? null;
  if (!prev || next.step < prev.step || prev.promptId !== next.promptId) return next;
  return {
    ...next,
    stepTimeS: next.stepTimeS ?? prev.stepTimeS,
    peakMemMb: next.peakMemMb ?? prev.peakMemMb,
    peakMemKind: next.peakMemMb !== null ? next.peakMemKind : prev.peakMemKind,
    levels: next.levels.length ? next.levels : prev.levels,
  };
}

/**
 * Which candidate nodes an event belongs to.
 *
 * @param {string|null} eventNode the payload's `node`
 * @param {{id: (number|string), inRoot: boolean}[]} candidates TokenSchedulerController nodes of the open graph
 * @returns {number[]} indices into candidates
 *
 * null → every candidate. "12" → the root-graph node with id 12. "7:12" (a node inside a subgraph) → candidates
 * with id 12 that are not in the root graph.
 */
export function matchEventToNodes(eventNode, candidates) {
  const out = [];
  (candidates || []).forEach((c, i) => {
    if (eventNode === null || eventNode === undefined) {
      out.push(i);
      return;
    }
    const target = String(eventNode);
    const id = String(c.id);
    if (!target.includes(":")) {
      if (target === id && c.inRoot !== false) out.push(i);
    } else if (c.inRoot === false && target.split(":").pop() === id) {
      out.push(i);
    }
  });
  return out;
}

/**
 * Live stats of every open workflow, each workflow's own: an event is filed under the workflow tab that queued its
 * prompt (./prompts.js), never under whichever tab is open when it arrives, so a tab shows only its own runs'
 * numbers. Keyed by node id, not by node object: undo, redo and a tab switch rebuild the node objects.
 */
export class StatsBook {
  constructor(prompts = new PromptWorkflows(), kept = WORKFLOWS_KEPT) {
    this.byWorkflow = new Map(); // workflow key -> Map(event node id ("12", "7:12", "*" = every node) -> stats)
    this.prompts = prompts;
    this.kept = kept; // workflows kept at most, least recently used dropped first: a long session stays bounded
  }

  /** Drop the numbers of workflows closed since (isOpen(workflow) false), and the oldest beyond the bound. */
  retain(isOpen) {
    forgetClosed(this.byWorkflow, isOpen, this.kept);
  }

  /**
   * A run started: that workflow's numbers become its previous run's (shown as such). They are kept until this run
   * sends numbers for the same node, never dropped by the start itself: a run without the node (a workflow with no
   * TokenSchedulerController, the node bypassed, another client's prompt) keeps the last report of the run that
   * had it. Returns the workflow key.
   */
  start(promptId, fallback) {
    const workflow = this.prompts.start(promptId, fallback);
    const nodes = touch(this.byWorkflow, workflow);
    const run = typeof promptId === "string" && promptId ? promptId : null;
    for (const [key, stats] of nodes ?? []) if (run === null || stats.promptId !== run) nodes.set(key, { ...stats, previous: true });
    return workflow;
  }

  /** File a normalized event; returns the workflow key it went to. */
  add(stats, fallback) {
    const workflow = this.prompts.workflowOf(stats.promptId, fallback);
    let nodes = touch(this.byWorkflow, workflow);
    if (!nodes) this.byWorkflow.set(workflow, (nodes = new Map()));
    forgetClosed(this.byWorkflow, () => true, this.kept);
    const key = stats.node ?? "*";
    if (key === "*") {
      // an event for every node: a node's own numbers from earlier runs would hide it (get() prefers them)
      for (const [k, s] of nodes) if (s.promptId !== stats.promptId || s.previous) nodes.delete(k);
    }
    const merged = mergeStats(nodes.get(key), stats);
    nodes.delete(key); // most recent last
    nodes.set(key, merged);
    return workflow;
  }

  /**
   * The server went away (the websocket closed): runs without their final event will never send it; they are shown
   * as stopped (a later event of the same run, after a reconnect, shows it running again).
   */
  stopRunning(reason) {
    for (const nodes of this.byWorkflow.values()) {
      for (const [key, stats] of nodes) if (!stats.final && !stats.stopped) nodes.set(key, { ...stats, stopped: reason });
    }
  }

  /**
   * The stats a TokenSchedulerController of `workflow` shows: "12" for root node 12; for a node inside a subgraph
   * (inRoot false) the latest event of an execution path ending in its id ("7:12"); else an event for every node.
   */
  get(workflow, nodeId, inRoot = true) {
    const nodes = this.byWorkflow.get(workflow);
    if (!nodes) return null;
    const id = String(nodeId);
    let found = null;
    for (const [key, stats] of nodes) {
      if (key === "*") continue;
      const hit = inRoot === false ? key.includes(":") && key.split(":").pop() === id : key === id;
      if (hit) found = stats;
    }
    return found ?? nodes.get("*") ?? null;
  }
}

/** Compact token count: 950, 4.1k, 65.5k, 1.2M. */
export function formatTokens(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "?";
  const a = Math.abs(n);
  if (a < 1000) return String(Math.round(n));
  if (a < 1e6) return `${(n / 1e3).toFixed(a < 1e4 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(1)}M`;
}

/** "0.41 s", "38 ms", "—" when unknown. */
export function formatSeconds(s) {
  if (typeof s !== "number" || !Number.isFinite(s) || s < 0) return "—";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

/** "3.05 GiB", "512 MiB", "—" when unknown. */
export function formatMemMb(mb) {
  if (typeof mb !== "number" || !Number.isFinite(mb) || mb < 0) return "—";
  return mb >= 1024 ? `${(mb / 1024).toFixed(2)} GiB` : `${Math.round(mb)} MiB`;
}

/** Kept fraction of one level (1 when nothing came in). */
export function keptFraction(level) {
  return level.tokensIn > 0 ? Math.max(0, Math.min(1, level.tokensOut / level.tokensIn)) : 1;
}

/** Removed fraction of one level: the chart's one unit (0 when nothing came in). */
export function removedFraction(level) {
  return 1 - keptFraction(level);
}

/**
 * Label of one level's bar, in the chart's unit: "/8  4.1k → 2.5k tokens, −40 % removed"; a DiT run's one level
 * (0: no U-Net levels, scheduling/dit_override.py) is "DiT  4.1k → 2k K/V tokens, −50 % removed".
 */
export function levelLabel(level) {
  const pct = Math.round(removedFraction(level) * 100);
  const [name, unit] = level.level === 0 ? ["DiT", "K/V tokens"] : [`/${level.level}`, "tokens"];
  return `${name}  ${formatTokens(level.tokensIn)} → ${formatTokens(level.tokensOut)} ${unit}, −${pct} % removed`;
}

/** Header lines for the node: progress, step time and peak memory, then the summary when the run is done. */
export function statsLines(stats) {
  if (!stats) return [];
  // a run cancelled or failed still sends its final event (with the summary), at the step it reached
  let head = stats.final ? `done ${stats.steps} steps` : `step ${stats.step}/${stats.steps}`;
  // a run of the workflow started since (a new run's numbers replace these when they come)
  const previous = stats.previous ? "previous run: " : "";
  // the server says how the run ended; older packs do not: a final step short of the steps meant stopped (a sampler
  // without a per-step callback can end a complete run short, so the status wins where it is given)
  const stopped = stats.status ? stats.status !== "complete" : stats.step < stats.steps;
  if (stats.final && stopped) head = `${stats.status === "failed" ? "failed" : "stopped"} at step ${stats.step}/${stats.steps}`;
  else if (!stats.final && stats.stopped) head = `stopped at step ${stats.step}/${stats.steps} (${stats.stopped})`;
  // on CPU the peak is the process's peak RSS, as the run summary says ("peak RSS 950 MiB (process)")
  const peak = `peak ${stats.peakMemKind === "rss" ? "RSS " : ""}${formatMemMb(stats.peakMemMb)}`;
  const lines = [`${previous}${head} · ${formatSeconds(stats.stepTimeS)}/step · ${peak}`];
  if (stats.final && stats.summary) lines.push(stats.summary);
  return lines;
}

function int(x) {
  const v = typeof x === "string" && x.trim() !== "" ? Number(x) : x;
  return typeof v === "number" && Number.isFinite(v) ? Math.trunc(v) : null;
}

function float(x) {
  const v = typeof x === "string" && x.trim() !== "" ? Number(x) : x;
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}
