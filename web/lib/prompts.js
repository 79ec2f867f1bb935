// Which workflow tab queued each prompt (pure; one shared instance per page).
//
// A page has one websocket and one client id for all its workflow tabs, and ComfyUI's events name the prompt, not
// the tab. The extensions wrap api.queuePrompt (wrapQueuePrompt) to note the open tab of each queue request, and
// file every run's events (live stats, node reports) under that tab, never under whichever tab is open when they
// arrive. A workflow key is anything with identity: the frontend's workflow object, or a string.

const PROMPTS_KEPT = 64;
/** Workflow tabs whose per-tab state (live stats, cleared reports) is kept at most, most recently used first. */
export const WORKFLOWS_KEPT = 16;

export class PromptWorkflows {
  constructor() {
    this.prompts = new Map(); // prompt id -> workflow key
    this.pending = []; // queue requests not answered yet, oldest first: {workflow}
    this.running = null; // prompt id of the run in progress (execution_start), null between runs
  }

  /** A queue request from `workflow` is under way; returns the function to call with its prompt id (or null). */
  queued(workflow) {
    const entry = { workflow };
    this.pending.push(entry);
    return (promptId) => {
      this.pending = this.pending.filter((e) => e !== entry);
      if (typeof promptId === "string" && promptId) this.bind(promptId, workflow);
    };
  }

  bind(promptId, workflow) {
    this.prompts.delete(promptId);
    this.prompts.set(promptId, workflow);
    while (this.prompts.size > PROMPTS_KEPT) this.prompts.delete(this.prompts.keys().next().value);
    return workflow;
  }

  /**
   * The workflow a prompt belongs to. A prompt this page did not queue (another client, or queued before a page
   * reload), or one whose queue answer has not arrived yet (the run can start first), goes to the workflow of the
   * oldest unanswered queue request, else to `fallback` (the open tab), once: its later events follow.
   */
  workflowOf(promptId, fallback) {
    if (typeof promptId !== "string" || !promptId) return fallback;
    if (this.prompts.has(promptId)) return this.prompts.get(promptId);
    return this.bind(promptId, this.pending.length ? this.pending[0].workflow : fallback);
  }

  /** execution_start: the run of `promptId` is in progress; returns its workflow. */
  start(promptId, fallback) {
    this.running = typeof promptId === "string" && promptId ? promptId : null;
    return this.workflowOf(this.running, fallback);
  }

  /** The workflow of the run in progress (`fallback` when unknown: an older server, no run seen). */
  runningWorkflow(fallback) {
    return this.workflowOf(this.running, fallback);
  }
}

/** The page's one instance: the scheduler chart and the report panels share it. */
export const pagePrompts = new PromptWorkflows();

/**
 * Wrap api.queuePrompt once so that `tracker` learns the open tab (`openWorkflow()`, read before any await) of
 * every prompt this page queues. Returns false when there is nothing to wrap.
 */
export function wrapQueuePrompt(api, openWorkflow, tracker = pagePrompts) {
  const original = api?.queuePrompt;
  if (typeof original !== "function") return false;
  if (original.__tokenfuse) return true;
  const queuePrompt = async function (...args) {
    const answered = tracker.queued(openWorkflow());
    let res;
    try {
      res = await original.apply(this, args);
    } finally {
      answered(res?.prompt_id);
    }
    return res;
  };
  queuePrompt.__tokenfuse = true;
  api.queuePrompt = queuePrompt;
  return true;
}

/**
 * Per-tab state of closed tabs goes: keys of `map` (workflow keys) for which isOpen(key) is false are deleted, then
 * the least recently used beyond `kept` (a Map iterates oldest first; touch() moves a key last). Returns the map.
 */
export function forgetClosed(map, isOpen, kept = WORKFLOWS_KEPT) {
  for (const key of [...map.keys()]) if (!isOpen(key)) map.delete(key);
  while (map.size > kept) map.delete(map.keys().next().value);
  return map;
}

/** Mark `key` of `map` as used now (last in iteration order); returns its value. */
export function touch(map, key) {
  const value = map.get(key);
  if (map.delete(key)) map.set(key, value);
  return value;
}

/**
 * Whether a workflow key is a tab still open in the frontend (the workflow store's isOpen); true where that cannot
 * be told (`none`, the one key of frontends without tabs, an older store), so nothing is dropped on a guess.
 */
export function isOpenWorkflowOf(app, workflow, none) {
  if (workflow === none) return true;
  try {
    const isOpen = app?.extensionManager?.workflow?.isOpen;
    return typeof isOpen === "function" ? isOpen(workflow) !== false : true;
  } catch {
    return true;
  }
}

/** The open workflow tab of the frontend (ComfyUI frontend >= 1.x: app.extensionManager.workflow), or `none`. */
export function openWorkflowOf(app, none) {
  try {
    return app?.extensionManager?.workflow?.activeWorkflow ?? none;
  } catch {
    return none;
  }
}
