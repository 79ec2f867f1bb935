// Per-block token-reduction ratios ("pyramid"): pure math shared by the chart and its tests.
//
// Mirrors scheduling/schedule.py: ratioFor() is Schedule.ratio_for, presetSchedule() is preset_schedule(),
// SCHEDULE_DEFAULTS are the Schedule dataclass defaults. Keep them line-by-line comparable when either side changes.

import { checkScheduleText, SCHEDULE_FIELD_DEFAULTS, widgetsFromText } from "./schedule_check.js";
import { FAMILY_LEVELS, LEVELS, MAX_RATIO } from "./vocabulary.js";

// LEVELS, MAX_RATIO and FAMILY_LEVELS come from the generated vocabulary.js; BLOCK_LEVELS and the preset tables are
// checked against scheduling/schedule.py by tests/test_vocabulary.py and tests/test_web_js.py.
export { FAMILY_LEVELS, LEVELS, MAX_RATIO };

/** Schedule defaults (scheduling/schedule.py, dataclass Schedule). */
export const SCHEDULE_DEFAULTS = Object.freeze({
  strategy: "todo",
  protectBlocks: 2,
  rampStart: 3,
  rampStep: 0.0,
  rampEvery: 2,
  rampCap: 0.5,
  startPercent: 0.0,
  endPercent: 1.0,
});

/**
 * Level of each attention site in ComfyUI's transformer_index order (one index per SpatialTransformer).
 * SD1.5: input 1,2 (/8), 4,5 (/16), 7,8 (/32); middle (/64); output 3-5 (/32), 6-8 (/16), 9-11 (/8).
 * SDXL: input 4,5 (/16), 7,8 (/32); middle (/32); output 0-2 (/32), 3-5 (/16).
 */
export const BLOCK_LEVELS = Object.freeze({
  sd15: Object.freeze([8, 8, 16, 16, 32, 32, 64, 32, 32, 32, 16, 16, 16, 8, 8, 8]),
  sdxl: Object.freeze([16, 16, 32, 32, 32, 32, 32, 32, 16, 16, 16]),
});

/**
 * Ratio of a level's tokens taken out of attention at one transformer index (Schedule.ratio_for).
 *
 * The first protectBlocks indices keep every token. From rampStart on, rampStep is added every rampEvery indices
 * (the first step already at rampStart), never above rampCap, and never below the level's base ratio.
 *
 * @param {number} base the level's ratio (Schedule.ratios[level], 0 when the level is not scheduled)
 * @param {number} index transformer_index (0-based)
 * @param {{protectBlocks: number, rampStart: number, rampStep: number, rampEvery: number, rampCap: number}} p
 * @returns {number} ratio in [0, MAX_RATIO]
 */
export function ratioFor(base, index, p) {
  let r = num(base, 0);
  if (r <= 0 || index < num(p.protectBlocks, SCHEDULE_DEFAULTS.protectBlocks)) return 0;
  const step = num(p.rampStep, SCHEDULE_DEFAULTS.rampStep);
  const start = num(p.rampStart, SCHEDULE_DEFAULTS.rampStart);
  const every = Math.max(1, num(p.rampEvery, SCHEDULE_DEFAULTS.rampEvery));
  if (step > 0 && index >= start) {
    const steps = Math.floor((index - start) / every) + 1;
    r = Math.max(r, Math.min(num(p.rampCap, SCHEDULE_DEFAULTS.rampCap), r + steps * step));
  }
  return round4(Math.min(r, MAX_RATIO));
}

/** Per-level ratios of the AGGRESSIVE presets (_LOWVRAM / _LOWVRAM_DIT in scheduling/schedule.py). */
const LOWVRAM = Object.freeze({
  lowvram_8gb: { sd15: { 8: 0.8, 16: 0.8, 32: 0.5 }, sdxl: { 16: 0.8, 32: 0.75 }, dit: 0.6 },
  lowvram_6gb: { sd15: { 8: 0.89, 16: 0.84, 32: 0.5 }, sdxl: { 16: 0.89, 32: 0.75 }, dit: 0.65 },
  lowvram_4gb: { sd15: { 8: 0.89, 16: 0.89, 32: 0.75, 64: 0.5 }, sdxl: { 16: 0.89, 32: 0.89 }, dit: 0.75 },
});

/** Named presets per family (preset_schedule). Returns a schedule object as resolveSchedule() does. */
export function presetSchedule(name, family = "sd15") {
  const d = { ...SCHEDULE_DEFAULTS, ratios: {}, ditRatio: 0 };
  if (name === "off") return d;
  if (name === "balanced") {
    if (family === "sdxl") return { ...d, strategy: "todo", ratios: { 16: 0.75, 32: 0.5 }, protectBlocks: 0 };
    if (family === "dit") return { ...d, strategy: "topk", ditRatio: 0.5, protectBlocks: 0 };
    return { ...d, strategy: "todo", ratios: { 8: 0.75, 16: 0.75 }, protectBlocks: 0 };
  }
  const table = LOWVRAM[name];
  if (!table) return null;
  if (family === "dit") return { ...d, strategy: "topk", ditRatio: table.dit, protectBlocks: 0 };
  return {
    ...d,
    strategy: "todo",
    ratios: { ...(table[family] ?? table.sd15) },
    protectBlocks: 0,
    rampStart: 3,
    rampStep: 0.05,
    rampEvery: 2,
    rampCap: 0.89,
  };
}

/** Every Schedule field (dataclass order); schedule_text may set any of them, others are an error in Python. */
export const SCHEDULE_FIELDS = Object.freeze(Object.keys(SCHEDULE_FIELD_DEFAULTS));

const DRAWN_FIELDS = Object.freeze({
  protect_blocks: "protectBlocks", ramp_start: "rampStart", ramp_step: "rampStep", ramp_every: "rampEvery",
  ramp_cap: "rampCap", start_percent: "startPercent", end_percent: "endPercent", dit_ratio: "ditRatio",
});

/** The Python text for a schedule_text the chart cannot preview (the server reads it as YAML). */
export const YAML_NOTE = "schedule_text is not JSON (YAML is applied at run time, not previewed)";

/**
 * Apply a schedule_text override (JSON only: YAML text is reported, not previewed) to a schedule object. The text
 * is checked as the server checks it (./schedule_check.js): what a run would refuse is an error here, with the
 * server's message.
 * @returns {{schedule: object, error: (string|null)}} the schedule unchanged plus an error when the text is unusable
 */
export function applyScheduleText(schedule, textValue) {
  const t = typeof textValue === "string" ? textValue.trim() : "";
  if (!t) return { schedule, error: null };
  const base = { strategy: schedule.strategy, ratios: schedule.ratios ?? {} };
  for (const [key, name] of Object.entries(DRAWN_FIELDS)) if (name in schedule) base[key] = schedule[name];
  const { fields, error, yaml } = checkScheduleText(t, base);
  if (yaml) return { schedule, error: YAML_NOTE };
  if (error) return { schedule, error };
  const out = { ...schedule };
  if ("strategy" in fields) out.strategy = fields.strategy;
  if ("ratios" in fields) out.ratios = fields.ratios;
  for (const [key, name] of Object.entries(DRAWN_FIELDS)) if (key in fields) out[name] = fields[key];
  return { schedule: out, error: null };
}

/**
 * The schedule the chart shows, from the node's widget values ({name: value}; any key may be missing).
 * Mirrors scheduling/widgets.py schedule_from_widgets: the preset for the family, then the strategy widget
 * ("preset" keeps the preset's), then ratio (> 0 replaces the ratio at every level the preset reduces; preset "off"
 * stays identity), then schedule_text (whose widget names, e.g. {"ratio": 0.5}, replace the widgets' values first;
 * `widgetValues` holds the values in effect when the text is accepted).
 */
export function resolveSchedule(values, family = "sd15") {
  const v = values || {};
  const widgets = widgetSchedule(v, family);
  // schedule_text may set the widgets by name ({"ratio": 0.5}): they replace the widgets' values first, as in Python
  const fromText = widgetsFromText(v.schedule_text);
  if (fromText.error) return { ...widgets.schedule, preset: widgets.preset, textError: fromText.error };
  const widgetValues = { ...v, ...fromText.widgets };
  const { schedule, preset } = widgetSchedule(widgetValues, family);
  const { schedule: final, error } = applyScheduleText(schedule, v.schedule_text);
  // a refused text changes nothing: the chart shows the widgets' own schedule, as a run would refuse to start
  if (error) return { ...widgets.schedule, preset: widgets.preset, textError: error };
  return { ...final, preset, textError: null, widgetValues };
}

/** The preset for the family, then the strategy and ratio widgets (schedule_from_widgets without the text). */
function widgetSchedule(v, family) {
  const preset = typeof v.preset === "string" && presetSchedule(v.preset, family) ? v.preset : "off";
  let schedule = presetSchedule(preset, family);
  if (typeof v.strategy === "string" && v.strategy !== "preset" && family !== "dit") {
    schedule = { ...schedule, strategy: v.strategy };
  }
  const ratio = clamp(num(v.ratio, 0), 0, MAX_RATIO);
  if (ratio > 0 && preset !== "off") {
    if (family === "dit") schedule = { ...schedule, ditRatio: ratio };
    else schedule = { ...schedule, ratios: Object.fromEntries(Object.keys(schedule.ratios).map((lv) => [lv, ratio])) };
  }
  return { schedule, preset };
}

/**
 * The level DiT runs report (scheduling/dit_override.py records every attention call at level 0): DiT models have no
 * U-Net levels, their tokens are one sequence at one resolution.
 */
export const DIT_LEVEL = 0;

/**
 * Model family for the chart: a `family` widget when the node has one, else what the last run's stats showed
 * (SDXL has attention only at /16 and /32, DiT reports the one level DIT_LEVEL), else SD1.5.
 * @param {string|undefined} widgetFamily
 * @param {{level: number}[]|undefined} statsLevels
 */
export function chartFamily(widgetFamily, statsLevels) {
  if (widgetFamily === "sd15" || widgetFamily === "sdxl" || widgetFamily === "dit") return widgetFamily;
  const levels = Array.isArray(statsLevels) ? statsLevels.map((l) => l?.level) : [];
  if (levels.length && levels.every((lv) => lv === DIT_LEVEL)) return "dit";
  if (levels.length && levels.every((lv) => lv === 16 || lv === 32)) return "sdxl";
  return "sd15";
}

/**
 * Chart series: one bar per transformer index with its level and ratio. DiT: one bar at DIT_LEVEL, the share of
 * K/V dropped in every attention call (dit_ratio; ComfyUI's DiT models give attention no block index to protect).
 */
export function pyramidSeries(schedule, family = "sd15") {
  if (family === "dit") return [{ index: 0, level: DIT_LEVEL, ratio: round4(clamp(num(schedule.ditRatio, 0), 0, MAX_RATIO)) }];
  const levels = BLOCK_LEVELS[family] ?? BLOCK_LEVELS.sd15;
  return levels.map((level, index) => ({ index, level, ratio: ratioFor(schedule.ratios?.[level] ?? 0, index, schedule) }));
}

function num(x, fallback) {
  const v = typeof x === "string" && x.trim() !== "" ? Number(x) : x;
  return typeof v === "number" && Number.isFinite(v) ? v : fallback;
}

function clamp(x, lo, hi) {
  return Math.min(hi, Math.max(lo, x));
}

function round4(x) {
  return Math.round(x * 1e4) / 1e4;
}
